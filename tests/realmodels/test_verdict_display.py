"""Issue 52 item 12: a verdict line shows one number under one name, the JSON record's: a value below 1 never reads
"1", and where the judged agreement counts only the flips the reference decided, the line names both fields.
Real models: PP-OCR's text-direction classifier and openwakeword's speech embedding, on the corpus's inputs."""

from __future__ import annotations

import re
from dataclasses import asdict

import numpy as np
import pytest

from autodeploy.accuracy import rules
from autodeploy.accuracy.measure import compare, graph_facts
from tests.realmodels.test_verdict_symptoms import _bf16, _corpus

pytestmark = pytest.mark.slow


def test_a_near_tie_flip_reads_as_the_record_names_it(photos, corpus_dir):
    path, ref = _corpus("ppocrv5-cls", photos, corpus_dir)
    probs = ref["softmax_0.tmp_0"]
    lead = np.abs(probs[:, 0] - probs[:, 1])
    item = int(np.argmin(lead))
    if lead[item] >= 0.2:
        pytest.skip(f"no near-tie among these {len(probs)} crops (closest lead {lead[item]:.2f})")
    flipped = probs.copy()
    flipped[item] = flipped[item, ::-1]  # the reference nearly tied there: not a decided change
    (o,) = compare({"softmax_0.tmp_0": flipped}, ref, **graph_facts(path).of("softmax_0.tmp_0")).outputs
    record = asdict(o)  # what --format json stores and prints
    every = 1 - 1 / len(probs)
    assert record["decided_agreement"] == 1.0 and record["top1_agreement"] == pytest.approx(every)
    line = rules.worst([o])
    assert f"top-1 agreement 1 where the reference decided (decided_agreement; every flip: {every:.4g}, top1_agreement)" in line


def test_a_cosine_below_one_never_reads_one(photos, corpus_dir):
    path, ref = _corpus("openwakeword-embedding", photos, corpus_dir)
    out = "conv2d_19"
    (o,) = [x for x in compare({k: _bf16(v) for k, v in ref.items()}, ref, **graph_facts(path).of(out)).outputs
            if x.name == out]  # fmt: skip
    assert o.kind == "embedding" and 0.999 < o.row_cosine < 1.0
    shown = re.search(r"worst row cosine (\S+)", rules.worst([o])).group(1)
    assert float(shown) < 1.0 and abs(float(shown) - o.row_cosine) < 1e-5, shown
