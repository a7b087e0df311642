"""rh3dgs.gaussians: morton_order against a bit-by-bit reference."""
import pytest
import torch

from rh3dgs.gaussians import morton_order


def _reference_codes(cells: torch.Tensor, bits: int) -> torch.Tensor:
    """Z-order codes by interleaving the cell indices' bits one at a time: bit b of axis a -> bit 3 b + a."""
    code = torch.zeros(len(cells), dtype=torch.long)
    for b in range(bits):
        for a in range(3):
            code |= ((cells[:, a] >> b) & 1) << (3 * b + a)
    return code


@pytest.mark.parametrize("bits", [1, 4, 16, 21])
def test_morton_order_sorts_by_interleaved_cell_bits(bits):
    g = torch.Generator().manual_seed(bits)
    cells = torch.randint(0, 1 << bits, (2000, 3), generator=g)
    cells[:2] = torch.tensor([[0, 0, 0], [(1 << bits) - 1] * 3])  # the box's corners: every cell index is reached
    pts = (cells.double() + 0.5) / (1 << bits)  # cell centres of the unit box
    # the box morton_order quantises over is the points' 1-99 % quantiles: give it exactly the unit box
    corners = torch.tensor([[0.0, 0, 0]] * 40 + [[1.0, 1, 1]] * 40, dtype=torch.float64)
    order = morton_order(torch.cat([pts, corners]), bits=bits)
    assert sorted(order.tolist()) == list(range(len(pts) + len(corners)))  # a permutation
    order = order[order < len(pts)]
    codes = _reference_codes(cells, bits)
    assert torch.equal(codes[order], torch.sort(codes).values)
    ties = codes[order][1:] == codes[order][:-1]  # equal codes keep the points' order (stable)
    assert bool((order[1:][ties] > order[:-1][ties]).all())


def test_morton_order_clamps_outliers_and_accepts_degenerate_input():
    pts = torch.rand(500, 3, generator=torch.Generator().manual_seed(0))
    far = torch.tensor([[1e6, 1e6, 1e6], [-1e6, 0.5, 0.5]])
    order = morton_order(torch.cat([pts, far]))
    # a point far outside the 1-99 % box takes its border cell, so the scene inside keeps its resolution
    # (over the min-max box all 500 would share one cell): consecutive points are near each other
    assert int(order[-1]) == 500  # the far corner: the largest code
    inner = order[order < 500]
    step = (pts[inner][1:] - pts[inner][:-1]).norm(dim=-1).mean()
    assert float(step) < 0.35 * float((pts[1:] - pts[:-1]).norm(dim=-1).mean())
    assert morton_order(torch.zeros(0, 3)).numel() == 0
    assert torch.equal(morton_order(torch.ones(5, 3)), torch.arange(5))  # one cell: the given order
    with pytest.raises(ValueError, match="bits"):
        morton_order(pts, bits=22)
