"""LIC: Lightweight Instance Consistency over a radius graph of Gaussian centres.

* Radius graph: for every Gaussian the (at most ``max_neighbors``) nearest other centres
  within distance ``gamma`` (k-d tree, O(N log N)).
* Positives ``P(a)``: the neighbours of anchor ``a`` that belong to its instance, as one of two
  pseudo-instance rules (``positives``) decides:

  - ``'features'`` (the paper): spherical (cosine) k-means of the current semantic features,
    refreshed every ``refresh_every`` steps after the warm-up; ``j`` is a positive when
    ``sem(j) = sem(a)``;
  - ``'appearance'`` (ours): ``j`` is a positive when its colour is within ``color_threshold`` of
    the anchor's, ``|c_j - c_a| < t``: a 3D neighbour that looks the same is a piece of the same
    surface. It reads the Gaussians' own colours, not the features being trained, so the
    instances cannot follow the field's errors.

* Loss, for a batch of anchors ``a`` (sampled among Gaussians that have a positive), one of two forms
  (``form``)::

      'infonce' (the paper's multi-positive "SupCon L_out"):
      Q(a) = (N_gamma(a) \\ P(a))  U  {R random Gaussians outside a's instance}     negatives
      s_aj = cos(f_a, f_j) / tau
      L_a  = -1/|P(a)| sum_{p in P(a)} log( exp(s_ap) / sum_{j in P(a) U Q(a)} exp(s_aj) )

      'pull' (ours): the positives' consensus, no negatives
      L_a  = 1/|P(a)| sum_{p in P(a)} (1 - cos(f_a, f_p)) = 1 - < f_a, mean_{p in P(a)} f_p >   (unit rows)

      L    = mean over the anchors

  Before ``warmup_steps`` the loss is an exact zero that keeps the autograd graph.

>>> import torch
>>> from rh3dgs.method.lic import LICConfig, LICLoss
>>> means = torch.tensor([[0.0, 0, 0], [0.01, 0, 0], [0.02, 0, 0]])
>>> colors = torch.tensor([[1.0, 0, 0], [1.0, 0, 0], [0.0, 0, 1]])     # two red Gaussians, one blue
>>> feats = torch.tensor([[1.0, 0], [0.0, 1], [0.0, 1]])
>>> lic = LICLoss(LICConfig(positives="appearance", form="pull", warmup_steps=0))
>>> lic(feats, 0, means=means, colors=colors)   # the red pair: 1 - cos 90 deg; the blue one has no positive
tensor(1.)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from scipy.spatial import cKDTree

from ..errors import ConfigError, NonFiniteError, ShapeError
from ..ranges import Range, check_fields
from ..ops.lic import lic_infonce, lic_pull

__all__ = ["LICConfig", "radius_graph", "spherical_kmeans", "pseudo_instances", "LICLoss"]

Tensor = torch.Tensor


@dataclass
class LICConfig:
    """Settings of the LIC loss: the paper's defaults here, the objective's in rh3dgs() (docs/method.md, section 4)."""

    radius: Annotated[float, Range(gt=0)] = 0.05
    """gamma: neighbourhood radius in world units (nerfstudio scenes span about [-1, 1])."""
    max_neighbors: Annotated[int, Range(ge=1)] = 16
    """Neighbours per Gaussian at most (the nearest are kept)."""
    num_anchors: Annotated[int, Range(ge=1)] = 1024
    """Anchors sampled per step, among the Gaussians that have a positive."""
    num_random_negatives: Annotated[int, Range(ge=0)] = 64
    """infonce: random Gaussians per anchor added as negatives (its own pseudo-instance's left out)."""
    temperature: Annotated[float, Range(gt=0)] = 0.1
    """tau in the InfoNCE logits cos / tau."""
    num_clusters: Annotated[int, Range(ge=1)] = 32
    """features: number of pseudo-instances (k of the spherical k-means)."""
    kmeans_iters: Annotated[int, Range(ge=0)] = 20
    """Lloyd iterations of the spherical k-means."""
    kmeans_max_points: Annotated[int, Range(ge=1)] = 200_000
    """The k-means is fitted on at most this many random Gaussians, then all are assigned."""
    cluster_position_weight: Annotated[float, Range(ge=0)] = 0.0
    """Weight of the positions in the clustering, >= 0 (0: features only; > 0: spatially compact instances)."""
    centered: bool = False
    """Contrast the features less their mean direction, taken at each refresh (for infonce)."""
    positives: str = "features"
    """features: a neighbour of the same pseudo-instance (the paper); appearance: of a colour within color_threshold."""
    color_threshold: Annotated[float, Range(gt=0)] = 0.1
    """appearance: RGB distance (colours in [0, 1]) below which a neighbour is a positive."""
    form: str = "infonce"
    """infonce: multi-positive InfoNCE with negatives (the paper); pull: mean 1 - cos to the positives."""
    refresh_every: Annotated[int, Range(ge=1)] = 1000
    """Rebuild the graph and the positives every this many steps (and whenever N changes)."""
    warmup_steps: Annotated[int, Range(ge=0)] = 5000
    """LIC is exactly 0 before this step."""
    seed: int = 0
    """Seed of the anchor and negative sampling and of the k-means."""
    kdtree_workers: Annotated[int, Range(ge=-1)] = -1
    """Threads of the k-d tree queries (-1: all cores; the graph is the same for any count)."""

    @classmethod
    def rh3dgs(cls, **overrides) -> "LICConfig":
        """The settings the objective uses: appearance positives (a neighbour within 0.1 in RGB), the pull form
        without negatives, radius 0.06 with up to 32 neighbours, 2048 anchors a step, no warm-up (why:
        docs/method.md, section 4, "Appearance positives and the pull form")."""
        base = dict(positives="appearance", form="pull", radius=0.06, max_neighbors=32, num_anchors=2048,
                    num_random_negatives=0, warmup_steps=0)
        base.update(overrides)
        return cls(**base)

    def __post_init__(self) -> None:
        check_fields(self)  # every numeric field against its declared Range (rh3dgs.ranges)
        if self.kdtree_workers == 0:
            raise ConfigError("LICConfig.kdtree_workers must be -1 (all cores) or >= 1, got 0")
        if self.positives not in ("features", "appearance"):
            raise ConfigError(f"LICConfig.positives must be 'features' or 'appearance', got {self.positives!r}")
        if self.form not in ("infonce", "pull"):
            raise ConfigError(f"LICConfig.form must be 'infonce' or 'pull', got {self.form!r}")


def radius_graph(means: Tensor, radius: float, max_neighbors: int, workers: int = 1) -> Tensor:
    """Capped radius graph over points with a k-d tree.

    Args:
        means: [N, 3] (any [N, C]) point positions.
        radius: include neighbours with distance <= radius.
        max_neighbors: keep at most this many (the nearest) neighbours per point.
        workers: threads for scipy's query.
    Returns:
        [N, max_neighbors] long on ``means.device``: neighbour indices sorted by distance,
        padded with -1; a point is never its own neighbour (duplicates of it are).
    """
    if means.dim() != 2:
        raise ShapeError(f"radius_graph: means must be [N, 3], got {list(means.shape)}")
    if not radius > 0:
        raise ConfigError(f"radius_graph: radius must be > 0, got {radius}")
    if max_neighbors < 1:
        raise ConfigError(f"radius_graph: max_neighbors must be >= 1, got {max_neighbors}")
    N = means.shape[0]
    out = torch.full((N, max_neighbors), -1, dtype=torch.long)
    if N <= 1:
        return out.to(means.device)
    pts = means.detach().to("cpu", torch.float64).numpy()
    if not np.isfinite(pts).all():
        raise NonFiniteError("radius_graph: means contain NaN/Inf")
    k = min(max_neighbors + 1, N)
    tree = cKDTree(pts)
    # scipy's bound is strict (d < bound): nudge it up so that d == radius is included
    _, idx = tree.query(pts, k=k, distance_upper_bound=float(np.nextafter(radius, np.inf)), workers=workers)
    idx = np.asarray(idx).reshape(N, k)  # nearest first; missing neighbours (index N) last
    # drop each point's own entry (at most one per row; absent only behind more than k duplicates) by moving
    # the entries after it one column left: the others keep their distance order
    own = idx == np.arange(N)[:, None]
    at = np.where(own.any(1), own.argmax(1), k)[:, None]
    cols = np.where(np.arange(k - 1)[None, :] < at, idx[:, :-1], idx[:, 1:])[:, :max_neighbors]
    out[:, : cols.shape[1]] = torch.from_numpy(np.where(cols < N, cols, -1).astype(np.int64))
    return out.to(means.device)


def spherical_kmeans(
    x: Tensor, num_clusters: int, seed: int = 0, iters: int = 20, max_points: int = 200_000
) -> Tuple[Tensor, Tensor]:
    """Cosine k-means with k-means++ seeding; deterministic for a given seed.

    Seeding draws centres with probability proportional to ``1 - cos`` to the nearest
    chosen centre (= squared chord distance / 2, i.e. the k-means++ D^2 rule on the sphere).
    Lloyd steps assign by max cosine and set centres to the normalised member sums; an
    empty cluster is re-seeded with the point worst served by its centre.

    Args:
        x: [N, d] features (normalised internally; no gradient).
        num_clusters: k (clipped to N).
        seed: seed of the CPU generator driving every random choice.
        iters: maximum Lloyd iterations (stops early when labels stop changing).
        max_points: fit on a random subset of at most this many rows, then assign all.
    Returns:
        ``(labels [N] long, centres [k, d] unit)`` on ``x.device``.
    """
    if x.dim() != 2:
        raise ShapeError(f"spherical_kmeans: x must be [N, d], got {list(x.shape)}")
    N, d = x.shape
    if N == 0:
        return torch.zeros(0, dtype=torch.long, device=x.device), x.new_zeros(0, d)
    if num_clusters < 1:
        raise ConfigError(f"spherical_kmeans: num_clusters must be >= 1, got {num_clusters}")
    with torch.no_grad():
        xn = F.normalize(x.detach().float(), dim=-1)
        if not torch.isfinite(xn).all():
            raise NonFiniteError("spherical_kmeans: x contains NaN/Inf")
        g = torch.Generator().manual_seed(int(seed))
        fit = xn
        if N > max_points:
            fit = xn[torch.randperm(N, generator=g)[:max_points].to(x.device)]
        n = fit.shape[0]
        k = min(int(num_clusters), n)

        # k-means++ seeding
        first = int(torch.randint(n, (1,), generator=g).item())
        centres = [fit[first]]
        dmin = (1.0 - fit @ fit[first]).clamp_min(0.0)
        for _ in range(1, k):
            cum = torch.cumsum(dmin.double(), 0)
            total = float(cum[-1].item())
            u = float(torch.rand((), generator=g, dtype=torch.float64).item())
            if total > 0:
                j = int(torch.searchsorted(cum, torch.tensor([u * total], dtype=torch.float64, device=cum.device)).item())
                j = min(j, n - 1)
            else:  # all points coincide with the chosen centres
                j = int(u * n) % n
            centres.append(fit[j])
            dmin = torch.minimum(dmin, (1.0 - fit @ fit[j]).clamp_min(0.0))
        C = torch.stack(centres)

        labels = None
        for _ in range(iters):
            sim = fit @ C.T
            best, new = sim.max(1)
            if labels is not None and torch.equal(new, labels):
                break
            labels = new
            sums = torch.zeros_like(C).index_add_(0, labels, fit)
            counts = torch.bincount(labels, minlength=k)
            empty = torch.nonzero(counts == 0).flatten()
            C = torch.where((counts > 0)[:, None], F.normalize(sums, dim=-1), C)
            if empty.numel() > 0:  # re-seed with the worst-served points
                worst = torch.argsort(best)[: empty.numel()]
                C[empty] = fit[worst]
        labels = (xn @ C.T).argmax(1)
    return labels, C


def pseudo_instances(
    features: Tensor,
    num_clusters: int,
    seed: int = 0,
    iters: int = 20,
    positions: Optional[Tensor] = None,
    position_weight: float = 0.0,
    max_points: int = 200_000,
) -> Tensor:
    """Pseudo-instance labels of Gaussians by spherical k-means of their features.

    With ``positions`` [N, 3] and ``position_weight > 0`` the clustered vectors are
    ``normalize([normalize(f), position_weight * (p - mean(p)) / rms_radius])`` so that a
    label also prefers spatially compact groups (rms_radius = sqrt(mean |p - mean|^2)).

    Args:
        features: [N, d]; num_clusters: k; seed, iters, max_points: see :func:`spherical_kmeans`.
    Returns:
        [N] long labels in ``0..k-1``.
    """
    if features.dim() != 2:
        raise ShapeError(f"pseudo_instances: features must be [N, d], got {list(features.shape)}")
    x = F.normalize(features.detach().float(), dim=-1)
    if positions is not None and position_weight > 0:
        if positions.dim() != 2 or positions.shape[0] != features.shape[0]:
            raise ShapeError(f"pseudo_instances: positions must be [N, 3], got {list(positions.shape)}")
        p = positions.detach().float().to(x.device)
        p = p - p.mean(0, keepdim=True)
        rms = p.pow(2).sum(-1).mean().sqrt().clamp_min(1e-12)
        x = torch.cat([x, position_weight * p / rms], dim=-1)
    labels, _ = spherical_kmeans(x, num_clusters, seed=seed, iters=iters, max_points=max_points)
    return labels


class LICLoss:
    """Stateful LIC loss: holds the radius graph and pseudo-instances between refreshes.

    Typical use in a training step::

        lic.maybe_refresh(step, gaussians.means, latents)   # cheap unless a refresh is due
        loss = lic(latents, step)

    Attributes:
        nbr_idx: [N, M] long neighbour indices (-1 padded) or None before the first refresh.
        labels: [N] long pseudo-instances (``positives='features'``) or None.
        colors: [N, 3] the colours of the last refresh (``positives='appearance'``) or None.
        positive: [N, M] bool, whether each neighbour is a positive.
        eligible: [E] long indices of Gaussians having at least one positive.
        last_refresh: step of the last refresh or None.
    """

    def __init__(self, cfg: Optional[LICConfig] = None) -> None:
        self.cfg = cfg or LICConfig()
        self.nbr_idx: Optional[Tensor] = None
        self.labels: Optional[Tensor] = None
        self.eligible: Optional[Tensor] = None
        self.last_refresh: Optional[int] = None
        self.center: Optional[Tensor] = None
        self.colors: Optional[Tensor] = None
        self.positive: Optional[Tensor] = None
        self._gen = torch.Generator().manual_seed(int(self.cfg.seed))

    def refresh(self, means: Tensor, features: Tensor, step: int = 0, colors: Optional[Tensor] = None) -> None:
        """Rebuild the radius graph from ``means`` [N, 3] and the positives from ``features`` [N, d] (the
        pseudo-instances, ``positives='features'``) or ``colors`` [N, 3] in [0, 1] (``positives='appearance'``)."""
        if means.dim() != 2 or features.dim() != 2 or means.shape[0] != features.shape[0]:
            raise ShapeError(f"LICLoss.refresh: means [N, 3] and features [N, d] must agree, got "
                             f"{list(means.shape)} and {list(features.shape)}")
        c = self.cfg
        nbr = radius_graph(means, c.radius, c.max_neighbors, workers=c.kdtree_workers).to(features.device)
        valid = nbr >= 0
        self.center = F.normalize(features.detach().float(), dim=-1).mean(0) if c.centered else None
        if c.positives == "appearance":
            if colors is None or colors.shape != (means.shape[0], 3):
                raise ConfigError(f"LICLoss: positives='appearance' needs the Gaussians' colours [N, 3] = "
                                  f"[{means.shape[0]}, 3], got {None if colors is None else list(colors.shape)}")
            col = colors.detach().float().to(features.device)
            if not torch.isfinite(col).all():
                raise NonFiniteError("LICLoss: colors contain NaN/Inf")
            self.colors, self.labels = col, None
        else:
            if self.center is not None:
                features = F.normalize(F.normalize(features.detach().float(), dim=-1) - self.center, dim=-1)
            labels = pseudo_instances(
                features, c.num_clusters, seed=c.seed, iters=c.kmeans_iters,
                positions=means if c.cluster_position_weight > 0 else None,
                position_weight=c.cluster_position_weight, max_points=c.kmeans_max_points,
            ).to(features.device)
            self.colors, self.labels = None, labels
        pos = valid & self._same_instance(torch.arange(means.shape[0], device=nbr.device), nbr.clamp_min(0))
        self.nbr_idx, self.positive = nbr, pos
        self.eligible = torch.nonzero(pos.any(1)).flatten()
        self.last_refresh = int(step)

    _STATE = ("nbr_idx", "labels", "eligible", "center", "colors", "positive")

    def state_dict(self) -> dict:
        """The graph, the positives, the last refresh and the sampling generator's state (a checkpoint: a run resumed
        from it draws the same anchors as one that went on)."""
        state = {k: getattr(self, k) for k in self._STATE}
        state.update(last_refresh=self.last_refresh, generator=self._gen.get_state())
        return state

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`."""
        for k in self._STATE:
            setattr(self, k, state[k])
        self.last_refresh = state["last_refresh"]
        self._gen.set_state(state["generator"])

    def _same_instance(self, anchors: Tensor, others: Tensor) -> Tensor:
        """[A, R] bool: whether ``others`` [A, R] would be positives of ``anchors`` [A] (their pseudo-instance, or
        their colour within ``color_threshold``)."""
        if self.labels is None:
            col = self.colors.to(anchors.device)
            return (col[others] - col[anchors][:, None]).norm(dim=-1) < self.cfg.color_threshold
        labels = self.labels.to(anchors.device)
        return labels[others] == labels[anchors][:, None]

    def invalidate(self) -> None:
        """The Gaussians changed (densified and pruned, possibly back to the same N, or loaded): the graph and its
        positives are rebuilt at the next step past the warm-up."""
        self.nbr_idx = self.positive = self.eligible = None

    def needs_refresh(self, step: int, num_points: int) -> bool:
        """True when past the warm-up and the graph is missing (never built, or :meth:`invalidate`), stale, or for
        another N."""
        if step < self.cfg.warmup_steps:
            return False
        if self.nbr_idx is None or self.last_refresh is None or self.nbr_idx.shape[0] != num_points:
            return True
        return step - self.last_refresh >= self.cfg.refresh_every

    def maybe_refresh(self, step: int, means: Tensor, features: Tensor, colors: Optional[Tensor] = None) -> bool:
        """Refresh when :meth:`needs_refresh`; returns whether it did."""
        if not self.needs_refresh(step, means.shape[0]):
            return False
        self.refresh(means, features, step, colors)
        return True

    def __call__(self, features: Tensor, step: int, means: Optional[Tensor] = None,
                 colors: Optional[Tensor] = None) -> Tensor:
        """LIC loss for per-Gaussian features [N, d] at ``step``.

        Returns an exact zero scalar connected to ``features`` (zero gradient) before the
        warm-up or when no Gaussian has a positive. With ``means`` (and, for
        ``positives='appearance'``, ``colors`` [N, 3]) given, refreshes first if due; otherwise
        :meth:`maybe_refresh` must have been called after the warm-up with the current N.
        """
        if features.dim() != 2:
            raise ShapeError(f"LICLoss: features must be [N, d], got {list(features.shape)}")
        zero = features.reshape(-1)[:0].sum()
        if step < self.cfg.warmup_steps:
            return zero
        if means is not None:
            self.maybe_refresh(step, means, features, colors)
        if self.nbr_idx is None or self.eligible is None:
            raise ConfigError("LICLoss: no graph yet; call maybe_refresh(step, means, features) after the warm-up "
                              "or pass means=")
        N = features.shape[0]
        if self.nbr_idx.shape[0] != N:
            raise ShapeError(f"LICLoss: graph built for {self.nbr_idx.shape[0]} Gaussians but features have {N} "
                             "(densified/pruned?); call refresh(means, features) or pass means=")
        if self.eligible.numel() == 0:
            return zero
        c = self.cfg
        dev = features.device
        if self.center is not None:  # cfg.centered: contrast what distinguishes the features
            features = F.normalize(F.normalize(features, dim=-1) - self.center.to(features), dim=-1)
        E = self.eligible.numel()
        pick = torch.randperm(E, generator=self._gen)[: c.num_anchors].to(dev)
        anchors = self.eligible.to(dev).index_select(0, pick)  # [A], each with a positive
        A = anchors.numel()
        nbr = self.nbr_idx.to(dev).index_select(0, anchors)  # [A, M], -1 padded
        is_pos = self.positive.to(dev).index_select(0, anchors)
        if c.form == "pull":  # 1 - <f_a, mean of the positives> = mean_p (1 - cos(f_a, f_p)) for unit rows
            return lic_pull(features, anchors, nbr, is_pos.to(torch.uint8) * 2).mean()
        valid = nbr >= 0
        R = c.num_random_negatives
        rnd = torch.randint(N, (A, R), generator=self._gen).to(dev)
        rnd_ok = ~self._same_instance(anchors, rnd) & (rnd != anchors[:, None])
        cand = torch.cat([nbr, rnd], 1)  # [A, M + R]
        # 0 = not in the set (padding, random pick of the anchor's instance), 1 = negative, 2 = positive
        kinds = torch.cat([valid.to(torch.uint8) + is_pos.to(torch.uint8), rnd_ok.to(torch.uint8)], 1)
        return lic_infonce(features, anchors, cand, kinds, c.temperature).mean()
