"""Training that cannot end worse than where it started, judged on data the user has: *check views*.

A share of the training views (``SelectionConfig.check_fraction``) are **check views**: their teacher maps
never enter training. They measure what the semantic field does on views it was not fitted to, with the
objective's own pixel term (:meth:`rh3dgs.method.objective.SemanticObjective.cell_losses`: the VCD-weighted
geodesic Huber loss of the decoded render against the teacher, at the teacher's grid), on the cells the scene
covers (pooled accumulated opacity >= 0.5: the background latent is a training device, not part of the field)::

    L_C(f) = sum_{c in covered check cells} w(c) rho_delta(d(z_hat_f(c), z(c))) / sum_c w(c)

For the comparison to be fair, the lift training starts from is the lift of the *other* training views, the
**fit lift** ``f_F`` (a lift is seconds): neither it nor training has seen a check view. (Against the lift of
every view, which has, the check loss favours the start: with 6 views it rose from the first check on, on
pairs where training gained held-out accuracy.)

1. **Step selection.** Every ``check_every`` steps the field's ``L_C`` is measured; the field of the step
   with the lowest one is kept (:class:`BestField`), not the last.
2. **Per-Gaussian fallback** (:func:`select_field`). The change of the check loss between ``f_F`` and the
   selected field ``f*`` is credited to the Gaussians by their compositing weights on the check cells
   (``a_i(c)``: Gaussian i's weight averaged over cell c)::

       g_i = sum_c a_i(c) w(c) (l_{f*}(c) - l_{f_F}(c)) / sum_c a_i(c) w(c)

   A Gaussian whose ``g_i`` is significantly above 0 - the check cells it composites into agree less with the
   teacher after training than before, by more than ``fallback_t`` standard errors ``sigma / sqrt(n_i)``
   (``sigma`` the weighted spread of the cells' loss changes, ``n_i = sum_c a_i(c)`` its weight in check cells)
   - falls back to the lift (Gaussians no check cell sees keep the selected value). (Every ``g_i > 0``
   reverted 20-40 % of the Gaussians on development pairs, most of them where training had helped.)
3. **The field returned** is the one of {lift, selected, selected with the fallback} with the lowest
   ``L_C`` (the lift measured as ``f_F``); where the lift is returned, it is the lift of *every* training view
   (``f_A``, what ``rh3dgs lift`` gives), which has the check views' information too.
4. **Refit** (``refit``, default): the check run decides; the field returned is trained again, from ``f_A`` on every
   view, for the selected number of steps, and the decisions are applied to it (:func:`apply_decisions`: ``f_A``
   for the Gaussians that fell back, or everywhere when the lift won). Without it the returned field lacks the
   check views (with 12 views, two): on development pairs that cost more than training gained.

What counts as "does not help" uses only the teacher maps of the check views (no ground truth). The cells
are noisy (a check view can be one of the teacher's failures), so the loss is the Huber one (a failed
view's pull is capped) and a Gaussian's decision averages over every check cell it touches.

Both ``distill()`` and ``ns-train rh3dgs`` (:class:`rh3dgs.nerfstudio.model.Rh3dgsModel`) call these
functions with the same :class:`SelectionConfig` (a field of :class:`~rh3dgs.method.objective.ObjectiveConfig`).

>>> check_view_indices(24, 1 / 6)
[3, 9, 15, 21]
>>> check_view_indices(6, 1 / 6), check_view_indices(1, 0.5), check_view_indices(24, 0.0)
([3], [], [])
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from ..ranges import Range, check_fields

__all__ = ["SelectionConfig", "check_view_indices", "check_loss", "BestField", "select_field", "CheckViews",
           "subset_maps", "fit_lift", "lift_latents", "apply_decisions"]


@dataclass
class SelectionConfig:
    """Check views, step selection and the per-Gaussian fallback (module docstring)."""

    check_fraction: Annotated[float, Range(ge=0, lt=1)] = 0.0
    """Share of the training views held out of the semantic loss as check views (at least one when > 0, none with
    fewer than 2 views; 0 = off: every view trains, the last step is kept)."""
    check_every: Annotated[int, Range(ge=1)] = 10
    """Steps between two measurements of the check loss."""
    gaussian_fallback: bool = True
    """Per-Gaussian fallback to the lift where training raised the check loss."""
    fallback_t: Annotated[float, Range(ge=0)] = 2.0
    """A Gaussian falls back when its check-loss increase is over this many standard errors (g_i > t sigma / sqrt(n_i))."""
    refit: bool = True
    """Train again on every view, from the lift of every view, for the selected number of steps, and apply the check
    run's decisions (lift, trained, or per Gaussian) to that field: the check views' information is not lost."""

    def __post_init__(self) -> None:
        check_fields(self)  # every numeric field against its declared Range (rh3dgs.ranges)

    @property
    def on(self) -> bool:
        return self.check_fraction > 0


def check_view_indices(num_views: int, fraction: float) -> List[int]:
    """``max(1, round(fraction * num_views))`` views spread evenly over the view order (the middle of each of that
    many equal runs of views): ``[]`` when ``fraction`` is 0 or there are fewer than 2 views."""
    if fraction <= 0 or num_views < 2:
        return []
    n = min(num_views - 1, max(1, int(round(fraction * num_views))))
    return [int((j + 0.5) * num_views / n) for j in range(n)]


def subset_maps(teacher_maps, ids: Sequence[int]):
    """The maps of views ``ids`` of a ``[B, h, w, D]`` tensor, a sequence of maps or a callable ``i -> map``."""
    ids = [int(i) for i in ids]
    if isinstance(teacher_maps, Tensor):
        return teacher_maps[ids]
    if callable(teacher_maps) and not isinstance(teacher_maps, Sequence):
        return lambda i: teacher_maps(ids[i])
    return [teacher_maps[i] for i in ids]


def fit_lift(gaussians, cameras, teacher_maps, check_ids: Sequence[int], lift_cfg):
    """The lift of the training views that are not check views (:func:`rh3dgs.lifting.lift`)."""
    from ..lifting import lift

    fit = [v for v in range(len(cameras)) if v not in set(int(i) for i in check_ids)]
    return lift(gaussians, cameras[fit], subset_maps(teacher_maps, fit), lift_cfg, progress=False)


def lift_latents(result, decoder: Tensor) -> Tensor:
    """A lift's features as unit latents of ``decoder`` ([D, d], orthonormal columns): ``normalize(f @ decoder)``,
    zero rows where the lift gave no feature."""
    lat = torch.nn.functional.normalize(result.features.to(decoder) @ decoder, dim=-1)
    return lat * result.valid.to(lat.device)[:, None]


def check_loss(objective, views, view_ids: Sequence[int], latents: Tensor, background: Optional[Tensor],
               decoder: Tensor, teacher: Sequence[Tensor], regions: Optional[Sequence[Tensor]] = None
               ) -> Tuple[Tensor, Tensor]:
    """Per check cell: the objective's pixel loss and weight (0 on cells the scene covers less than half),
    ``([V, h, w], [V, h, w])`` (no gradient).

    Args: objective: :class:`~rh3dgs.method.objective.SemanticObjective`; views: :class:`rh3dgs.rendering.FixedViews`
    holding the check views; view_ids: their indices in ``views``; latents [N, d] as rendered; background [d] (the
    objective's background latent, or None for zero); teacher: per check view its [h, w, D] map as the teacher gives it;
    regions: per check view its [H, W] region fractions (when the objective reads them).
    """
    losses, weights = [], []
    bg = objective.background
    with torch.no_grad():
        if background is not None:
            saved = bg.data.clone()
            bg.data.copy_(background)
        try:
            for j, v in enumerate(view_ids):
                lat2d = views.render(latents, [v])
                reg = None if regions is None else regions[j][None]
                alpha = views.alpha[v:v + 1]
                l, w = objective.cell_losses(lat2d, alpha, views.d1[v:v + 1], views.d2[v:v + 1], decoder,
                                             teacher[j][None].float(), reg)
                covered = objective.pool(alpha[..., None], tuple(l.shape[1:3]))[..., 0] >= 0.5
                losses.append(l[0])
                weights.append((w * covered)[0])
        finally:
            if background is not None:
                bg.data.copy_(saved)
    return torch.stack(losses), torch.stack(weights)


def _mean(loss: Tensor, w: Tensor) -> float:
    return float((loss * w).sum() / w.sum().clamp_min(1e-12))


@dataclass
class BestField:
    """The trained state with the lowest check loss so far (:meth:`offer`), and every measurement."""

    state: Optional[Dict[str, Tensor]] = None
    step: int = -1
    loss: float = float("inf")
    tag: object = None
    history: List[Tuple[int, float]] = field(default_factory=list)

    def offer(self, step: int, loss: float, state: Dict[str, Tensor], tag: object = None) -> None:
        """Record ``loss`` at ``step``; keep a copy of ``state`` if it is the lowest (``tag``: e.g. the geometry's
        version, for a caller whose Gaussians change)."""
        self.history.append((int(step), float(loss)))
        if loss < self.loss:
            self.state = {k: v.detach().clone() for k, v in state.items()}
            self.step, self.loss, self.tag = int(step), float(loss), tag


def _credit(objective, views, view_ids: Sequence[int], grid: Tuple[int, int], cell_values: Tensor) -> Tensor:
    """[N] ``sum_c a_i(c) cell_values(c)``: per Gaussian, its compositing weight averaged over each cell, times
    the cell's value, summed over the check cells (one backward through the render of a constant)."""
    N = len(views.gaussians)
    with torch.enable_grad():  # the callers run under no_grad
        ones = torch.ones(N, 1, device=cell_values.device, requires_grad=True)
        for j, v in enumerate(view_ids):
            pooled = objective.pool(views.render(ones, [v]), grid)[0, ..., 0]
            (pooled * cell_values[j].detach()).sum().backward()
    return ones.grad[:, 0].detach()


def select_field(objective, views, view_ids: Sequence[int], decoder: Tensor, teacher: Sequence[Tensor],
                 reference: Tensor, selected: Tensor, selected_background: Optional[Tensor],
                 regions: Optional[Sequence[Tensor]] = None, fallback: bool = True,
                 lift: Optional[Tensor] = None, t: float = 2.0) -> Tuple[Tensor, Dict[str, object]]:
    """Steps 2 and 3 of the module docstring: the field to return, of {lift, selected, mixed}, and what was decided.

    Args: reference [N, d]: the rendered latents of the fit lift (measured for the lift; background latent zero);
    selected [N, d]: those of the selected step, ``selected_background`` its background latent; lift [N, d]: what
    is returned for the lift and taken back by the fallback (the lift of every view; None: ``reference``); t: the
    fallback's threshold in standard errors (:attr:`SelectionConfig.fallback_t`); the rest as :func:`check_loss`. Returns ``(latents [N, d], info)``: info has ``choice`` ("lift", "selected" or "mixed"),
    ``check_loss`` per candidate, ``fallback_fraction`` (share of the Gaussians with a feature given the lift) and
    ``revert`` ([N] bool: the Gaussians given the lift).
    """
    lift = reference if lift is None else lift
    zero = torch.zeros_like(objective.background)
    l0, w = check_loss(objective, views, view_ids, reference, zero, decoder, teacher, regions)
    l1, _ = check_loss(objective, views, view_ids, selected, selected_background, decoder, teacher, regions)
    cands = {"lift": (lift, _mean(l0, w)), "selected": (selected, _mean(l1, w))}
    live = selected.detach().abs().sum(-1) > 0
    revert = torch.zeros_like(live)
    if fallback:
        grid = tuple(l0.shape[1:3])
        d = l1 - l0
        num = _credit(objective, views, view_ids, grid, w * d)
        den = _credit(objective, views, view_ids, grid, w)
        cells = _credit(objective, views, view_ids, grid, (w > 0).to(w))  # check cells' worth of weight
        mean = float((w * d).sum() / w.sum().clamp_min(1e-12))
        sigma = float(((w * (d - mean) ** 2).sum() / w.sum().clamp_min(1e-12)).sqrt())
        g = num / den.clamp_min(1e-12)
        revert = live & (den > 0) & (g > t * sigma / cells.clamp_min(1e-12).sqrt())
        measured = torch.where(revert[:, None], reference, selected)
        lm, _ = check_loss(objective, views, view_ids, measured, selected_background, decoder, teacher, regions)
        cands["mixed"] = (torch.where(revert[:, None], lift, selected), _mean(lm, w))
    choice = min(cands, key=lambda k: cands[k][1])
    share = {"lift": 1.0, "selected": 0.0, "mixed": float(revert.sum()) / max(1, int(live.sum()))}[choice]
    info = {"choice": choice, "check_loss": {k: v[1] for k, v in cands.items()}, "fallback_fraction": share,
            "revert": revert if choice == "mixed" else torch.full_like(revert, choice == "lift")}
    return cands[choice][0], info


def apply_decisions(info: Dict[str, object], refitted: Tensor, lift: Tensor) -> Tensor:
    """The check run's decisions applied to the field trained again on every view (``refit``): the lift where the
    check run fell back to it (every Gaussian for the choice "lift"), ``refitted`` elsewhere ([N, d] each)."""
    return torch.where(info["revert"].to(refitted.device)[:, None], lift, refitted)


class CheckViews:
    """The check views of one training run: what ``distill()`` and ``ns-train rh3dgs`` call (module docstring).

    Args: objective: the run's :class:`~rh3dgs.method.objective.SemanticObjective` (its ``cfg.selection``);
    views: a callable giving the :class:`rh3dgs.rendering.FixedViews` that hold the check views (the same object for
    fixed geometry; rebuilt from the current Gaussians where they move); ids: the check views' indices in it;
    teacher: their maps as the teacher gives them; regions: their region fractions (when the objective reads them).

    Per run: ``if checks.due(step, steps): checks.measure(step, latents, background)`` after each optimiser step,
    then ``latents, info = checks.finish(start, latents, background)``.
    """

    def __init__(self, objective, views: Callable[[], object], ids: Sequence[int], teacher: Sequence[Tensor],
                 regions: Optional[Sequence[Tensor]] = None):
        self.objective, self.views, self.ids = objective, views, list(ids)
        self.teacher, self.regions = list(teacher), None if regions is None else list(regions)
        self.cfg: SelectionConfig = objective.cfg.selection
        self.best = BestField()

    def due(self, step: int, steps: int) -> bool:
        """Whether the field after optimiser step ``step`` (0-based) of ``steps`` is measured."""
        return (step + 1) % self.cfg.check_every == 0 or step == steps - 1

    def measure(self, step: int, latents: Tensor, background: Tensor, decoder: Tensor, tag: object = None) -> float:
        """The check loss of the field after step ``step`` (rendered latents [N, d]), kept if the lowest so far."""
        l, w = check_loss(self.objective, self.views(), self.ids, latents.detach(), background.detach(), decoder,
                          self.teacher, self.regions)
        loss = _mean(l, w)
        self.best.offer(step + 1, loss, {"latents": latents, "background": background}, tag)
        return loss

    def finish(self, reference: Tensor, latents: Tensor, background: Tensor, decoder: Tensor, lift: Tensor,
               tag: object = None) -> Tuple[Tensor, Dict[str, object]]:
        """The field to return (:func:`select_field` on the best measured step, or on ``latents`` when that step's
        state does not fit the Gaussians any more: ``tag`` differs) and what was decided. ``reference``: the fit
        lift's latents, ``lift``: the lift of every view (both [N, d] as rendered)."""
        b = self.best
        usable = b.state is not None and b.tag == tag
        sel, bg = (b.state["latents"], b.state["background"]) if usable else (latents.detach(), background.detach())
        out, info = select_field(self.objective, self.views(), self.ids, decoder, self.teacher, reference, sel, bg,
                                 self.regions, self.cfg.gaussian_fallback, lift, self.cfg.fallback_t)
        info.update(selected_step=b.step if usable else None, check_history=list(b.history))
        return out, info
