"""docs/scale.md's Spark recipe, run as written on a local Spark (`local[2]`, the JVM
of the system's packages) with its three paths pointed at a temporary folder: the
vectors it writes equal Model.embed's in this process."""

import os
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import qkv
from conftest import assert_close, required

SCALE_MD = Path(__file__).resolve().parents[3] / "docs" / "scale.md"
MARKER = "<!-- the Spark recipe:"


def recipe():
    """The ```python block after the marker in docs/scale.md."""
    text = SCALE_MD.read_text()
    after = text[text.index(MARKER):]
    return re.search(r"```python\n(.*?)```", after, re.S).group(1)


def spark_or_fail():
    problems = []
    try:
        import pyspark  # noqa: F401
    except ImportError:
        problems.append("pyspark is not importable (crates/qkv-py/requirements-test.txt installs it)")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        problems.append("no JVM (java on PATH or JAVA_HOME): install the system's OpenJDK")
    if problems:
        message = "; ".join(problems)
        if os.environ.get("QKV_PY_REQUIRE_ALL"):
            pytest.fail(message)
        pytest.skip(message)


def test_the_docs_spark_recipe_writes_model_embeds_vectors(tmp_path, monkeypatch):
    spark_or_fail()
    # the workers run this venv's Python, which has qkv (as a cluster's executors need it)
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    model = required("QKV_MINILM_DIR", "the real all-MiniLM-L6-v2 folder (tools/fetch_minilm.sh)")
    texts = [f"sentence {i}: attention weighs the values by how well keys match" * (1 + i % 3)
             for i in range(48)]
    (tmp_path / "texts").mkdir()
    pd.DataFrame({"id": np.arange(48), "text": texts}).to_parquet(tmp_path / "texts" / "part-0.parquet")

    code = recipe()
    line = 'MODEL, TEXTS, VECTORS = "all-MiniLM-L6-v2", "texts/", "vectors/"'
    assert line in code, "the recipe's paths line changed: update this test"
    code = code.replace(line, f"MODEL, TEXTS, VECTORS = {str(model)!r}, "
                              f"{str(tmp_path / 'texts')!r}, {str(tmp_path / 'vectors')!r}")
    # the session the recipe's getOrCreate() finds: two local cores, no web UI
    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    try:
        spark.sparkContext.setLogLevel("ERROR")
        exec(compile(code, str(SCALE_MD), "exec"), {"__name__": "spark_recipe"})
    finally:
        spark.stop()

    got = pd.read_parquet(tmp_path / "vectors").sort_values("id")
    assert got["id"].tolist() == list(range(48)) and got["text"].tolist() == texts
    expected = qkv.load(model).embed(texts)
    assert_close("the recipe's vectors", np.stack(got["embedding"]), expected, atol=1e-5)
