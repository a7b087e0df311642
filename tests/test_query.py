"""rh3dgs/query.py: the query rules (defaults, phrases, relevancy, the min-alpha mask, selection), and that
they are defined there only."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import rh3dgs
from rh3dgs import query as Q
from rh3dgs.errors import ConfigError, ShapeError
from rh3dgs.field import SemanticField

PACKAGE = Path(rh3dgs.__file__).resolve().parent


def test_defaults():
    assert Q.TEMPERATURE == 10.0 and Q.THRESHOLD == 0.5 and Q.MIN_ALPHA == 0.1
    assert Q.CANONICAL_NEGATIVES == ("object", "things", "stuff", "texture")
    assert Q.parse_queries(Q.format_queries(Q.CANONICAL_NEGATIVES)) == Q.CANONICAL_NEGATIVES
    assert Q.parse_queries(None) == () and Q.parse_queries(" ; ;") == ()


def test_relevancy_is_lerfs_min_over_pairwise_softmax():
    g = torch.Generator().manual_seed(0)
    pos, neg = torch.rand(9, 2, generator=g) * 2 - 1, torch.rand(9, 4, generator=g) * 2 - 1
    pair = torch.stack([pos[:, :, None].expand(-1, -1, 4), neg[:, None, :].expand(-1, 2, -1)], -1)  # [9, 2, 4, 2]
    ref = torch.softmax(Q.TEMPERATURE * pair, -1)[..., 0].min(-1).values
    torch.testing.assert_close(Q.relevancy_from_cosines(pos, neg), ref)
    torch.testing.assert_close(Q.relevancy_from_cosines(pos, neg[:, :0]), torch.sigmoid(10 * pos))


def test_feature_relevancy_and_the_latent_fast_path_agree():
    g = torch.Generator().manual_seed(1)
    f = SemanticField(torch.randn(30, 6, generator=g), torch.randn(20, 6, generator=g),
                      torch.arange(30) % 3 != 0)
    phi = torch.nn.functional.normalize(torch.randn(2, 20, generator=g), dim=-1)
    neg = torch.nn.functional.normalize(torch.randn(3, 20, generator=g), dim=-1)
    lat = torch.randn(5, 7, 6, generator=g)
    torch.testing.assert_close(f.relevancy(lat, phi, neg), Q.feature_relevancy(f.decode(lat), phi, neg),
                               atol=1e-5, rtol=0)
    per_g = Q.gaussian_relevancy(f, phi, neg)
    ref = Q.feature_relevancy(f.decode(), phi, neg).T * f.valid[None]
    torch.testing.assert_close(per_g, ref, atol=1e-5, rtol=0)
    assert torch.equal(f.gaussian_relevancy(phi, neg), per_g)
    with pytest.raises(ShapeError):
        Q.feature_relevancy(lat, phi, neg)  # latents are not teacher-space features


def test_relevancy_maps_mask_pixels_without_surface():
    g = torch.Generator().manual_seed(2)
    f = SemanticField(torch.randn(4, 5, generator=g), torch.randn(8, 5, generator=g))
    lat = torch.randn(3, 4, 5, generator=g)
    alpha = torch.tensor([[0.0, 0.05, 0.1, 0.5]] * 3)
    alpha[1, 1] = float("nan")
    phi = torch.nn.functional.normalize(torch.randn(2, 8, generator=g), dim=-1)
    neg = torch.nn.functional.normalize(torch.randn(4, 8, generator=g), dim=-1)
    maps = Q.relevancy_maps(f, lat, alpha, phi, neg)
    assert maps.shape == (2, 3, 4)
    covered = alpha >= Q.MIN_ALPHA
    assert float(maps[:, ~covered].abs().sum()) == 0.0
    torch.testing.assert_close(maps[:, covered], f.relevancy(lat, phi, neg).permute(2, 0, 1)[:, covered])


def test_selection():
    rel = torch.tensor([[0.2, 0.7, 0.5, 0.9], [0.6, 0.1, 0.4, 0.3]])
    assert Q.select_gaussians(rel, index=0).tolist() == [False, True, False, True]
    assert Q.select_gaussians(rel).tolist() == [True, True, False, True]  # any query (max)
    assert Q.select_gaussians(rel, 0.65).tolist() == [False, True, False, True]
    torch.testing.assert_close(Q.reduce_queries(rel), torch.tensor([0.6, 0.7, 0.5, 0.9]))
    with pytest.raises(ConfigError):
        Q.reduce_queries(rel[:0])


# ------------------------------------------------------------------------------ one definition each
def _sources():
    return {p.relative_to(PACKAGE).as_posix(): p.read_text(encoding="utf-8") for p in PACKAGE.rglob("*.py")}


@pytest.mark.parametrize("what,pattern", [
    ("the temperature default", r"temperature\s*(:\s*float\s*)?=\s*10(\.0*)?\b|\bTEMPERATURE\s*(:\s*float\s*)?="),
    ("the selection threshold default", r"(?i:threshold\b[^\n]*(?<![\w.])0?\.50*(?![\w.]))|\bTHRESHOLD\s*(:\s*float\s*)?="),
    ("the minimum alpha", r"alpha\s*(>=|<)\s*0?\.10*\b|min_alpha\s*(:\s*float\s*)?=\s*0?\.1|\bMIN_ALPHA\s*(:\s*float\s*)?="),
    ("the canonical negatives", r"\(\s*[\"']object[\"']\s*,\s*[\"']things[\"']"),
    ("the relevancy formula", r"sigmoid\(\s*temperature\s*\*"),
    ("the relevancy mask", r"masked_fill_?\(\s*~\s*\(\s*alpha|\*\s*\(\s*alpha\s*>="),
])
def test_query_rules_are_defined_in_query_py_only(what, pattern):
    """Each query default / rule is written once, in query.py (before: 11 temperature defaults, 10 thresholds,
    3 minimum alphas and 3 masks in api.py, controls.py, eval/suite.py, ...); the op's torch reference
    restates the formula on purpose (the native op is tested against it)."""
    hits = {name: len(re.findall(pattern, text)) for name, text in _sources().items() if re.search(pattern, text)}
    allowed = {"query.py", "ops/_ref.py"} if what == "the relevancy formula" else {"query.py"}
    assert set(hits) <= allowed and hits.get("query.py"), f"{what} defined in {hits}"
    if what != "the relevancy formula":
        assert hits["query.py"] == 1, f"{what}: {hits['query.py']} definitions in query.py"
