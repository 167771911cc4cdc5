"""Type stubs of qkv's native module. Shapes use B batch, T query length, S key length,
H query heads, G key/value heads (dividing H), D head width, Dv value width, C model
width, V vocabulary."""

from os import PathLike
from typing import Any, Dict, List, Literal, Mapping, Optional, Sequence, Tuple, Union, overload

import numpy as np
import numpy.typing as npt

F32 = npt.NDArray[np.float32]
Bools = npt.NDArray[np.bool_]
Ints = Union[npt.NDArray[np.integer], Sequence[int], Sequence[Sequence[int]]]
Causal = Union[None, bool, Literal["top_left", "bottom_right"]]
Layout = Literal["bthd", "bhtd"]
KernelName = Literal["tiled", "reference"]

__version__: str
EXPERIMENTS: List[str]

@overload
def attention(
    q: F32,
    k: F32,
    v: F32,
    *,
    causal: Causal = None,
    key_padding: Optional[Bools] = None,
    mask: Optional[Bools] = None,
    bias: Optional[F32] = None,
    alibi_slopes: Optional[F32] = None,
    window: Optional[int] = None,
    scale: Optional[float] = None,
    return_weights: Literal[False] = False,
    layout: Layout = "bthd",
    kernel: KernelName = "tiled",
) -> Tuple[F32, F32]:
    """Scaled dot-product attention ``softmax(Q·Kᵀ·scale + bias)·V``.

    q ``[B, T, H, D]``, k ``[B, S, G, D]``, v ``[B, S, G, Dv]`` (``[B, H, T, D]``,
    ``[B, G, S, D]``, ``[B, G, S, Dv]`` with ``layout="bhtd"``). Returns ``(out, lse)``:
    out ``[B, T, H, Dv]`` in the input layout, lse ``[B, H, T]``."""

@overload
def attention(
    q: F32,
    k: F32,
    v: F32,
    *,
    causal: Causal = None,
    key_padding: Optional[Bools] = None,
    mask: Optional[Bools] = None,
    bias: Optional[F32] = None,
    alibi_slopes: Optional[F32] = None,
    window: Optional[int] = None,
    scale: Optional[float] = None,
    return_weights: Literal[True],
    layout: Layout = "bthd",
    kernel: KernelName = "tiled",
) -> Tuple[F32, F32, F32]:
    """As above; also returns the softmax weights ``[B, H, T, S]``."""

def attention_backward(
    q: F32,
    k: F32,
    v: F32,
    out: F32,
    lse: F32,
    d_out: F32,
    *,
    causal: Causal = None,
    key_padding: Optional[Bools] = None,
    mask: Optional[Bools] = None,
    bias: Optional[F32] = None,
    alibi_slopes: Optional[F32] = None,
    window: Optional[int] = None,
    scale: Optional[float] = None,
    return_dbias: bool = False,
    layout: Layout = "bthd",
    kernel: KernelName = "tiled",
) -> Tuple[F32, ...]:
    """Gradients ``(dq, dk, dv)`` (and ``dbias`` with ``return_dbias``) of
    :func:`attention` given ``d_out = dL/d out``, shaped as ``q``, ``k``, ``v``
    (and ``bias``)."""

class Model:
    """A checkpoint folder loaded by :func:`load`."""

    @property
    def info(self) -> Dict[str, Any]:
        """``family``, ``architecture``, ``kind``, ``layers``, ``decoder_layers``,
        ``hidden``, ``heads``, ``kv_heads``, ``head_dim``, ``ffn_dim``, ``vocab``,
        ``max_positions``, ``position``, ``norm``, ``ffn``, ``bos_token_id``,
        ``eos_token_id``, ``pad_token_id``, ``decoder_start_token_id``, ``parameters``,
        ``dtypes``, ``dtype``, ``kv_dtype`` (and a classifier's ``labels``)."""

    def forward(
        self,
        input_ids: Ints,
        attention_mask: Optional[Ints] = None,
        *,
        decoder_input_ids: Optional[Ints] = None,
        token_type_ids: Optional[Ints] = None,
        output_attentions: bool = False,
    ) -> Dict[str, Union[F32, List[F32]]]:
        """``logits`` ``[B, T, V]`` (encoders: ``last_hidden_state`` ``[B, T, C]``, and
        ``logits`` with a masked-LM head); with ``output_attentions``, per-layer
        ``[B, H, T, S]`` weights under ``attentions`` or ``encoder_attentions``,
        ``decoder_attentions``, ``cross_attentions``."""

    @overload
    def generate(
        self,
        prompt: str,
        *,
        messages: None = None,
        max_new_tokens: Optional[int] = None,
        greedy: bool = False,
        num_beams: Optional[int] = None,
        length_penalty: Optional[float] = None,
        early_stopping: Union[None, bool, Literal["never"]] = None,
        temperature: Optional[float] = None,
        top_k: Optional[int] = None,
        top_p: Optional[float] = None,
        min_p: Optional[float] = None,
        repetition_penalty: Optional[float] = None,
        seed: int = 0,
        json_schema: Union[None, str, Mapping[str, Any]] = None,
        grammar: Optional[str] = None,
        stream: Literal[False] = False,
    ) -> str:
        """The generated text (a continuation, or a translation)."""

    @overload
    def generate(
        self,
        prompt: Sequence[int],
        *,
        messages: None = None,
        max_new_tokens: Optional[int] = None,
        greedy: bool = False,
        num_beams: Optional[int] = None,
        length_penalty: Optional[float] = None,
        early_stopping: Union[None, bool, Literal["never"]] = None,
        temperature: Optional[float] = None,
        top_k: Optional[int] = None,
        top_p: Optional[float] = None,
        min_p: Optional[float] = None,
        repetition_penalty: Optional[float] = None,
        seed: int = 0,
        json_schema: Union[None, str, Mapping[str, Any]] = None,
        grammar: Optional[str] = None,
        stream: Literal[False] = False,
    ) -> List[int]:
        """The new token ids."""

    @overload
    def generate(
        self,
        prompt: Sequence[str],
        *,
        messages: None = None,
        max_new_tokens: Optional[int] = None,
        greedy: bool = False,
        num_beams: Optional[int] = None,
        length_penalty: Optional[float] = None,
        early_stopping: Union[None, bool, Literal["never"]] = None,
        temperature: Optional[float] = None,
        top_k: Optional[int] = None,
        top_p: Optional[float] = None,
        min_p: Optional[float] = None,
        repetition_penalty: Optional[float] = None,
        seed: int = 0,
        json_schema: Union[None, str, Mapping[str, Any]] = None,
        grammar: Optional[str] = None,
        stream: Literal[False] = False,
    ) -> List[str]:
        """Each prompt's text, the prompts batched by the engine (prompt i samples with seed + i)."""

    @overload
    def generate(
        self,
        prompt: Sequence[Sequence[int]],
        *,
        messages: None = None,
        max_new_tokens: Optional[int] = None,
        greedy: bool = False,
        num_beams: Optional[int] = None,
        length_penalty: Optional[float] = None,
        early_stopping: Union[None, bool, Literal["never"]] = None,
        temperature: Optional[float] = None,
        top_k: Optional[int] = None,
        top_p: Optional[float] = None,
        min_p: Optional[float] = None,
        repetition_penalty: Optional[float] = None,
        seed: int = 0,
        json_schema: Union[None, str, Mapping[str, Any]] = None,
        grammar: Optional[str] = None,
        stream: Literal[False] = False,
    ) -> List[List[int]]:
        """Each prompt's new ids, the prompts batched by the engine (prompt i samples with seed + i)."""

    @overload
    def generate(
        self,
        prompt: Union[str, Sequence[int]],
        *,
        messages: None = None,
        max_new_tokens: Optional[int] = None,
        greedy: bool = False,
        num_beams: Optional[int] = None,
        length_penalty: Optional[float] = None,
        early_stopping: Union[None, bool, Literal["never"]] = None,
        temperature: Optional[float] = None,
        top_k: Optional[int] = None,
        top_p: Optional[float] = None,
        min_p: Optional[float] = None,
        repetition_penalty: Optional[float] = None,
        seed: int = 0,
        json_schema: Union[None, str, Mapping[str, Any]] = None,
        grammar: Optional[str] = None,
        stream: Literal[True],
    ) -> "Stream":
        """The output as it is made: text pieces for a text prompt, else ids."""

    @overload
    def generate(
        self,
        prompt: None = None,
        *,
        messages: Sequence[Mapping[str, Any]],
        max_new_tokens: Optional[int] = None,
        greedy: bool = False,
        num_beams: Optional[int] = None,
        length_penalty: Optional[float] = None,
        early_stopping: Union[None, bool, Literal["never"]] = None,
        temperature: Optional[float] = None,
        top_k: Optional[int] = None,
        top_p: Optional[float] = None,
        min_p: Optional[float] = None,
        repetition_penalty: Optional[float] = None,
        seed: int = 0,
        json_schema: Union[None, str, Mapping[str, Any]] = None,
        grammar: Optional[str] = None,
        stream: bool = False,
    ) -> Union[str, "Stream"]:
        """The assistant's answer to a conversation, through the folder's chat template."""

    def attribute(
        self,
        text: Union[str, Sequence[int]],
        *,
        method: Literal["weights", "value-norm", "rollout", "flow", "grad", "ablation"] = "weights",
        target: Union[None, int, str] = None,
        decoder_input: Union[None, str, Sequence[int]] = None,
    ) -> Dict[str, Any]:
        """What the model used on one text: ``method``, ``tokens``, ``target``,
        ``scores`` ``[S]`` (each token's credit for the target) and, except for
        ablation, ``maps``: per attention a list per layer of ``[H, T, S]`` (weights,
        value-norm) or ``[T, S]`` (rollout, flow, grad)."""

    def embed(self, texts: Sequence[str], *, batch_size: int = 32) -> F32:
        """Sentence embeddings ``[N, dim]`` (sentence-transformers folders)."""

    def classify(
        self,
        texts: Sequence[str],
        *,
        pairs: Optional[Sequence[str]] = None,
        truncate: Literal["warn", "cut", "refuse"] = "warn",
    ) -> Dict[str, Union[List[str], F32]]:
        """``label`` (``N`` strings), ``score`` ``[N]``, ``scores`` ``[N, L]`` and
        ``logits`` ``[N, L]`` of a ``…ForSequenceClassification`` folder, scored as
        transformers' text-classification pipeline scores."""

    def encode(self, text: str, *, add_special_tokens: bool = True) -> List[int]:
        """Token ids of ``text``."""

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``, without special tokens."""

    @overload
    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tokenize: Literal[False] = False,
        **kwargs: Any,
    ) -> str:
        """The prompt a conversation makes through the folder's chat template, as
        transformers' ``apply_chat_template``; token ids with ``tokenize=True``."""

    @overload
    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tokenize: Literal[True],
        **kwargs: Any,
    ) -> List[int]: ...

class Stream:
    """What ``Model.generate(..., stream=True)`` returns: an iterator over the output
    as it is made, text pieces (as ``qkv generate`` prints them) or token ids."""

    def __iter__(self) -> "Stream": ...
    def __next__(self) -> Union[str, int]: ...

def load(
    path: Union[str, "PathLike[str]"],
    *,
    dtype: Literal["f32", "bf16", "int8", "int8-row"] = "f32",
    kv_dtype: Literal["f32", "bf16"] = "f32",
) -> Model:
    """Loads a Hugging Face, sentence-transformers or qkv model folder, or a GGUF file; its
    linear layers compute in ``dtype`` (a GGUF file's Q8_0 ones from their blocks), and
    ``generate`` keeps its KV cache in ``kv_dtype``."""

def sinusoidal_table(
    n_positions: int, dim: int, *, layout: Literal["interleaved", "split"] = "interleaved"
) -> F32:
    """``[n_positions, dim]`` fixed sinusoidal encodings."""

def alibi_slopes(n_heads: int) -> F32:
    """``[n_heads]`` ALiBi slopes, as BLOOM computes them."""

def relative_position_bucket(
    relative_position: Union[int, Ints],
    *,
    bidirectional: bool = True,
    num_buckets: int = 32,
    max_distance: int = 128,
) -> npt.NDArray[np.int64]:
    """T5's bucket of each ``key − query`` distance, shaped as the input."""

class Rope:
    """Rotary position embedding over ``head_dim``-wide heads."""

    def __init__(
        self,
        head_dim: int,
        *,
        base: float = 10000.0,
        layout: Literal["half", "interleaved"] = "half",
        rotary_dim: Optional[int] = None,
        scaling: Optional[Dict[str, Any]] = None,
        max_positions: Optional[int] = None,
    ) -> None: ...
    @property
    def inv_freq(self) -> F32:
        """``[rotary_dim / 2]`` frequencies θ_i after scaling."""

    def cos_sin(self, positions: Ints) -> Tuple[F32, F32]:
        """``(cos, sin)``, each ``[N, rotary_dim / 2]``."""

    def apply(self, x: F32, positions: Optional[Ints] = None, *, offset: int = 0) -> F32:
        """``x`` ``[B, T, H, head_dim]`` rotated to its positions (a new array)."""

def train(
    *,
    init: Union[None, str, "PathLike[str]"] = None,
    data: Union[None, str, "PathLike[str]"] = None,
    task: Optional[str] = None,
    text: Union[None, str, "PathLike[str]"] = None,
    resume: Union[None, str, "PathLike[str]"] = None,
    task_length: Optional[int] = None,
    symbols: Optional[int] = None,
    queries: Optional[int] = None,
    distance: Optional[int] = None,
    seq_len: Optional[int] = None,
    val_fraction: Optional[float] = None,
    batch_size: Optional[int] = None,
    arch: Optional[Literal["transformer", "rnn", "rnn-seq2seq", "rnn-attention"]] = None,
    style: Optional[Literal["gpt2", "llama"]] = None,
    d_model: Optional[int] = None,
    layers: Optional[int] = None,
    heads: Optional[int] = None,
    kv_heads: Optional[int] = None,
    ffn: Optional[int] = None,
    position: Optional[Literal["none", "sinusoidal", "learned", "rope", "alibi"]] = None,
    norm: Optional[Literal["layernorm", "rmsnorm"]] = None,
    post_norm: bool = False,
    ffn_kind: Optional[Literal["relu", "gelu", "gelu-tanh", "swiglu"]] = None,
    steps: Optional[int] = None,
    lr: Optional[float] = None,
    constant_lr: bool = False,
    warmup: Optional[int] = None,
    min_lr: Optional[float] = None,
    weight_decay: Optional[float] = None,
    beta1: Optional[float] = None,
    beta2: Optional[float] = None,
    eps: Optional[float] = None,
    decay: Optional[Literal["standard", "all", "none"]] = None,
    clip: Optional[float] = None,
    dtype: Optional[Literal["f32", "bf16"]] = None,
    seed: Optional[int] = None,
    threads: Optional[int] = None,
    eval_every: Optional[int] = None,
    eval_batches: Optional[int] = None,
    save_every: Optional[int] = None,
    stop_after: Optional[int] = None,
    out: Union[None, str, "PathLike[str]"] = None,
    overwrite: bool = False,
    log_json: Union[None, str, "PathLike[str]"] = None,
    progress: bool = False,
) -> List[Dict[str, Any]]:
    """Trains as ``qkv train`` does, its flags as keywords; returns each step's log
    line (``step``, ``loss``, ``lr``, ``grad_norm``, ``eval_loss``, ``eval_accuracy``)."""

def experiment(
    name: str,
    *,
    quick: bool = False,
    seed: int = 0,
    progress: bool = False,
    models: Sequence[Union[str, "PathLike[str]"]] = (),
) -> Dict[str, Any]:
    """Runs one of :data:`EXPERIMENTS`; returns its report (claim, verdict, rule,
    metrics, figures). ``models``: folders ``precision`` and ``attribution`` measure as well."""

def set_num_threads(n: int) -> None:
    """Threads of qkv's kernels; call before the first computation."""

def get_num_threads() -> int:
    """Threads of qkv's kernels."""
