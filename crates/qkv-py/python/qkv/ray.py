"""Batch inference on Ray Data: callable classes for ``Dataset.map_batches``.

Each class loads its model folder once per worker (an actor of Ray's pool) with a
``dtype`` and a thread count, then maps batches: it reads a text column and adds its
results as new columns, keeping the batch's other columns (an id, say) as they are.

>>> import ray, qkv.ray
>>> ds = ray.data.read_parquet("texts/")                        # a "text" column
>>> ds = ds.map_batches(qkv.ray.Embed, fn_constructor_kwargs={"path": "minilm"},
...                     concurrency=4, num_cpus=1, batch_size=256)
>>> ds.write_parquet("embeddings/")                             # + "embedding" [N, dim]

Each worker computes on as many threads as the CPUs Ray reserves for it
(``num_cpus``; or ``threads``): several one-thread workers keep a machine's cores as busy as one
process with that many threads (docs/scale.md measures it), and Ray spreads them over
a cluster's machines.

Batches come as Ray Data gives them: a dict of NumPy arrays (``batch_format="numpy"``,
the default) or a pandas ``DataFrame`` (``batch_format="pandas"``); the result has the
same form. Nothing here imports Ray: the classes are plain callables, usable on such
batches anywhere (with :func:`shared` to keep one a process, as Spark's
``mapInPandas`` needs).
"""

import os
from typing import Any, Dict, List, Optional

import numpy as np

from ._qkv import get_num_threads, load, set_num_threads

__all__ = ["Classify", "Embed", "Generate", "shared"]


def _use_threads(n: Optional[int]) -> None:
    """Sizes this process's thread pool to ``n`` as a worker starts; a pool already
    built with ``n`` threads is accepted, one of another size is an error. ``None``:
    the CPUs Ray reserved for the worker, which Ray exports as ``OMP_NUM_THREADS``,
    where the pool is not built yet; else the pool as it is."""
    if n is None:
        reserved = os.environ.get("OMP_NUM_THREADS", "")
        if reserved.isdigit() and int(reserved) >= 1:
            try:
                set_num_threads(int(reserved))
            except ValueError:
                pass
        return
    try:
        set_num_threads(n)
    except ValueError:
        if get_num_threads() != n:
            raise ValueError(
                f"invalid threads: {n}: this process already computes on "
                f"{get_num_threads()} threads (one pool a process; give each worker its own "
                "process, as Ray's actors are)"
            ) from None


def _texts(batch: Any, column: str) -> List[str]:
    """The strings of ``batch[column]``, naming the column and row of a missing or
    non-string value."""
    try:
        values = batch[column]
    except KeyError:
        have = ", ".join(map(str, list(batch.keys()))) or "none"
        raise KeyError(f"the batch has no column `{column}` (columns: {have})") from None
    texts = values.tolist() if hasattr(values, "tolist") else list(values)
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise ValueError(
                f"column `{column}` row {i} of the batch is {type(t).__name__}, not a string"
            )
    return texts


def _with_columns(batch: Any, columns: Dict[str, Any]) -> Any:
    """``batch`` with ``columns`` added (or replaced): a dict of arrays stays one, a
    DataFrame gets a column per name (a 2-D array as one array a row)."""
    if isinstance(batch, dict):
        out = dict(batch)
        out.update(columns)
        return out
    out = batch.copy()
    for name, values in columns.items():
        out[name] = list(values) if getattr(values, "ndim", 1) > 1 else values
    return out


_SHARED: Dict[Any, Any] = {}


def shared(cls: Any, *args: Any, **kwargs: Any) -> Any:
    """The instance ``cls(*args, **kwargs)`` this process made before, or a new one:
    a model loaded once per worker process where the framework calls a plain function
    per partition (Spark's ``mapInPandas``, a multiprocessing pool) rather than keeping
    an instance as Ray's actors do. The arguments must be hashable."""
    key = (cls, args, tuple(sorted(kwargs.items())))
    if key not in _SHARED:
        _SHARED[key] = cls(*args, **kwargs)
    return _SHARED[key]


class _Worker:
    def __init__(self, path: str, dtype: str, threads: Optional[int]):
        _use_threads(threads)
        self.model = load(path, dtype=dtype)


class Embed(_Worker):
    """Sentence embeddings of a sentence-transformers folder (``Model.embed``): the
    ``text_column`` strings in, ``output_column`` float32 ``[N, dim]`` out.

    Args:
        path: the model folder, readable on every worker.
        dtype: what the linear layers compute in (``qkv.load``'s ``dtype``).
        threads: the worker's threads; by default the CPUs Ray reserved for it
            (``num_cpus``, which Ray exports as ``OMP_NUM_THREADS``), or outside Ray
            the process's pool as it is.
        text_column, output_column: the column names.
        batch_size: sentences per forward within a batch.
    """

    def __init__(
        self,
        path: str,
        *,
        dtype: str = "f32",
        threads: Optional[int] = None,
        text_column: str = "text",
        output_column: str = "embedding",
        batch_size: int = 32,
    ):
        super().__init__(path, dtype, threads)
        self.text_column, self.output_column = text_column, output_column
        self.batch_size = batch_size

    def __call__(self, batch: Any) -> Any:
        texts = _texts(batch, self.text_column)
        vectors = self.model.embed(texts, batch_size=self.batch_size)
        return _with_columns(batch, {self.output_column: vectors})


class Classify(_Worker):
    """Labels and scores of a ``…ForSequenceClassification`` folder (``Model.classify``):
    the ``text_column`` strings (with ``pair_column``'s as second texts, for a
    cross-encoder) in; ``label`` (str), ``score`` (float32) and ``scores`` (float32
    ``[N, L]``, in ``model.info["labels"]`` order) out, named by ``prefix`` + those.

    Args:
        path, dtype, threads, text_column: as :class:`Embed`.
        pair_column: the column of second texts, or None.
        truncate: ``Model.classify``'s ``truncate`` (``"refuse"`` fails the batch).
        prefix: put before the output columns' names.
    """

    def __init__(
        self,
        path: str,
        *,
        dtype: str = "f32",
        threads: Optional[int] = None,
        text_column: str = "text",
        pair_column: Optional[str] = None,
        truncate: str = "warn",
        prefix: str = "",
    ):
        super().__init__(path, dtype, threads)
        self.text_column, self.pair_column = text_column, pair_column
        self.truncate, self.prefix = truncate, prefix

    def __call__(self, batch: Any) -> Any:
        texts = _texts(batch, self.text_column)
        pairs = _texts(batch, self.pair_column) if self.pair_column else None
        r = self.model.classify(texts, pairs=pairs, truncate=self.truncate)
        p = self.prefix
        return _with_columns(
            batch,
            {
                p + "label": np.array(r["label"], dtype=object),
                p + "score": r["score"],
                p + "scores": r["scores"],
            },
        )


class Generate(_Worker):
    """Text continuations of a decoder or encoder-decoder folder (``Model.generate``,
    the batch's prompts decoded together): the ``prompt_column`` strings in, the
    ``output_column`` strings out.

    Args:
        path, dtype, threads: as :class:`Embed`.
        prompt_column, output_column: the column names.
        chat: read each prompt as a user message through the folder's chat template
            (the answer, without the template's text, comes out).
        **options: ``Model.generate``'s keywords (``max_new_tokens``, ``greedy``,
            ``temperature``, ``top_p``, ``seed``, ``json_schema``…). With sampling, the
            prompt at row i of a batch samples with ``seed + i``: give ``greedy=True``
            for outputs that do not depend on how Ray cuts the batches.
    """

    def __init__(
        self,
        path: str,
        *,
        dtype: str = "f32",
        threads: Optional[int] = None,
        prompt_column: str = "prompt",
        output_column: str = "generated",
        chat: bool = False,
        **options: Any,
    ):
        super().__init__(path, dtype, threads)
        self.prompt_column, self.output_column = prompt_column, output_column
        self.chat, self.options = chat, options

    def __call__(self, batch: Any) -> Any:
        prompts = _texts(batch, self.prompt_column)
        if self.chat:
            ids = [
                self.model.apply_chat_template([{"role": "user", "content": p}], tokenize=True)
                for p in prompts
            ]
            texts = [self.model.decode(new) for new in self.model.generate(ids, **self.options)]
        else:
            texts = self.model.generate(prompts, **self.options)
        return _with_columns(batch, {self.output_column: np.array(texts, dtype=object)})
