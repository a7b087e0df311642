"""rh3dgs.lifting.checkpoint: a lift stopped after a pass resumes there (lift(checkpoint=...)), a folder of another
job is never resumed from, the fingerprint of the inputs."""
import pytest
import torch

from rh3dgs.lifting import LiftConfig, lift
from rh3dgs.lifting.checkpoint import fingerprint
from rh3dgs.lifting.views import LiftViews

from _scenes import random_lift_scene


def test_a_stopped_lift_resumes_after_its_last_pass(tmp_path, monkeypatch):
    gs, cams, maps = random_lift_scene(n=400, views=4, size=32, D=8, seed=5)
    cfg = LiftConfig(iters=4, tol=0.0, latent_dim=4)
    full = lift(gs, cams, maps, cfg, progress=False)
    irls_pass = LiftViews.irls_pass

    def stop_in_pass_3(self, mu, delta, description, *args, **kwargs):
        if "pass 3" in description:
            raise KeyboardInterrupt
        return irls_pass(self, mu, delta, description, *args, **kwargs)

    monkeypatch.setattr(LiftViews, "irls_pass", stop_in_pass_3)
    with pytest.raises(KeyboardInterrupt):
        lift(gs, cams, maps, cfg, progress=False, checkpoint=tmp_path)
    monkeypatch.setattr(LiftViews, "irls_pass", irls_pass)
    assert sorted(p.name for p in tmp_path.glob("pass-*.json")) == ["pass-002.json"]  # older passes deleted
    again = lift(gs, cams, maps, cfg, progress=False, checkpoint=tmp_path)
    assert again.info["resumed_after_pass"] == 2 and again.info["passes"] == full.info["passes"] == 5
    assert torch.equal(again.valid, full.valid) and torch.equal(again.filled, full.filled)
    torch.testing.assert_close(again.features, full.features, atol=1e-5, rtol=0)  # replayed, not cached: sum order
    assert again.info["step_quantile_per_pass"][:2] == full.info["step_quantile_per_pass"][:2]

    other = lift(gs, cams, maps, LiftConfig(iters=4, tol=0.0, latent_dim=4, delta=0.3), progress=False,
                 checkpoint=tmp_path)  # another job's settings: the folder is cleared, nothing resumed
    assert "resumed_after_pass" not in other.info


def test_fingerprint():
    a = torch.arange(6.0)
    assert fingerprint(a, "x") == fingerprint(a.clone(), "x")
    assert fingerprint(a, "x") != fingerprint(a.reshape(2, 3), "x") != fingerprint(a.double(), "x")
    assert fingerprint(a, "x") != fingerprint(a, "y")
