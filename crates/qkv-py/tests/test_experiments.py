"""qkv.experiment: one of the articles' claims measured from Python, its report the
same document as ``qkv experiment NAME --json`` computes."""

import pytest

import qkv


def test_the_mask_experiment_reports_its_claim_numbers_and_verdict():
    assert "mask" in qkv.EXPERIMENTS and len(qkv.EXPERIMENTS) == 10
    report = qkv.experiment("mask", quick=True, seed=0)
    assert report["name"] == "mask"
    assert report["claim"]["zh"] and report["claim"]["en"]
    assert report["verdict"] == "supported"
    assert report["rule"]
    models = {m["model"]: m for m in report["metrics"]["models"]}
    # the causal mask keeps every logit at or before t unchanged by later tokens
    assert models["causal mask"]["max_logit_change_at_or_before_t"] == 0.0
    assert report["figures"], "at least one figure's data"


def test_model_folders_are_for_the_precision_and_attribution_experiments_only():
    with pytest.raises(ValueError, match="precision"):
        qkv.experiment("heads", quick=True, models=["somewhere"])
