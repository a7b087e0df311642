"""rh3dgs.data.labelled: the one reader of the labelled-dataset layout (masks, classes, depth, class_id)."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from rh3dgs.data.labelled import BACKGROUND, LabelledDataset
from rh3dgs.errors import InputFileError


@pytest.fixture
def labelled(tmp_path) -> Path:
    """Two 3 x 4 views of classes 0..2 with background, depth maps, and 5 labelled Gaussians."""
    from rh3dgs.gaussians import Gaussians
    from rh3dgs.io.ply import save_ply

    root = tmp_path / "data"
    (root / "masks").mkdir(parents=True)
    (root / "depth").mkdir()
    (root / "classes.txt").write_text("floor\nred ball\n\nblue box\n")
    for k, stem in enumerate(("frame_00001", "frame_00000")):
        m = np.array([[0, 1, 2, 255], [1, 1, 255, 255], [2, 0, 0, k]], np.uint8)
        Image.fromarray(m).save(root / "masks" / f"{stem}.png")
        np.save(root / "depth" / f"{stem}.npy", np.where(m == 255, 0, 1.5 + k).astype(np.float32))
    g = Gaussians.from_activated(torch.zeros(5, 3), torch.full((5, 3), 0.1), torch.tensor([[1.0, 0, 0, 0]] * 5),
                                 torch.full((5,), 0.5), torch.rand(5, 3))
    g.extra = {"class_id": torch.tensor([0.0, 1, 2, 2, 0])}
    save_ply(root / "scene.ply", g)
    return root


def test_reads_every_part(labelled):
    ds = LabelledDataset.open(labelled)
    assert ds.classes == ["floor", "red ball", "blue box"]  # blank lines skipped: line k = class id k
    assert ds.stems == ["frame_00000", "frame_00001"]  # sorted
    m = ds.mask("frame_00001")
    assert m.dtype == np.int64 and m.tolist() == [[0, 1, 2, 255], [1, 1, 255, 255], [2, 0, 0, 0]]
    assert BACKGROUND == 255 and set(ds.masks()) == {"frame_00000", "frame_00001"}
    d = ds.depth("frame_00000", m.shape)
    assert d.dtype == np.float32 and d[0, 3] == 0 and d[0, 0] == 2.5
    masks, depths = ds.arrays(["frame_00001", "frame_00000"])  # in the order asked
    assert masks.dtype == torch.int64 and masks.shape == depths.shape == (2, 3, 4)
    assert masks[1, 2, 3] == 1 and depths[0, 0, 0] == 1.5
    assert ds.class_ids().tolist() == [0, 1, 2, 2, 0]


def test_reads_what_write_dataset_writes(tmp_path):
    from rh3dgs.data.synthetic import SceneConfig, make_scene, write_dataset

    sc = make_scene(SceneConfig(num_views=2, image_size=24, gaussians_per_unit_area=300))
    write_dataset(sc, tmp_path / "data", progress=False)
    ds = LabelledDataset.open(tmp_path / "data")
    assert ds.classes == sc.class_names and ds.stems == sc.cameras.names
    assert torch.equal(torch.from_numpy(ds.class_ids()), sc.class_ids)
    masks, depths = ds.arrays(ds.stems)
    assert masks.shape == (2, 24, 24) and ((masks == 255) == (depths == 0)).all()


def _expect(root: Path, needle: str, path: Path, call=lambda ds: ds.masks()):
    with pytest.raises(InputFileError, match=needle) as ei:
        call(LabelledDataset.open(root))
    assert str(ei.value).startswith(str(path)) and "\n" not in str(ei.value)


def test_errors_name_the_file(labelled, tmp_path):
    with pytest.raises(InputFileError, match="dataset folder not found"):
        LabelledDataset.open(tmp_path / "nothing")
    bad = tmp_path / "bad"
    shutil.copytree(labelled, bad)
    mask = bad / "masks" / "frame_00000.png"
    Image.fromarray(np.full((3, 4), 7, np.uint8)).save(mask)
    _expect(bad, "value 7 is not a class index", mask)
    Image.fromarray(np.zeros((3, 4, 3), np.uint8)).save(mask)
    _expect(bad, "single-channel integer image", mask)
    mask.write_bytes(b"not a png")
    _expect(bad, "cannot read image", mask)
    shutil.copy(labelled / "masks" / "frame_00000.png", mask)
    depth = bad / "depth" / "frame_00000.npy"
    np.save(depth, np.zeros((4, 3), np.float32))
    _expect(bad, r"depth shape \[4, 3\] != mask shape \[3, 4\]", depth, lambda ds: ds.arrays(ds.stems))
    depth.write_bytes(b"\x93NUMPY garbage")
    _expect(bad, "cannot read the depth map", depth, lambda ds: ds.arrays(ds.stems))
    depth.unlink()
    _expect(bad, r"missing depth map \(for a test\)", depth, lambda ds: ds.depth("frame_00000", why="for a test"))
    (bad / "classes.txt").write_text("a\nb\na\n")
    with pytest.raises(InputFileError, match=r"duplicate class names \['a'\]"):
        LabelledDataset.open(bad)
    (bad / "classes.txt").write_text("\n\n")
    with pytest.raises(InputFileError, match="no class names"):
        LabelledDataset.open(bad)
    (bad / "classes.txt").unlink()
    with pytest.raises(InputFileError, match="classes.txt"):
        LabelledDataset.open(bad)
    (bad / "classes.txt").write_text("a\n")
    shutil.rmtree(bad / "masks")
    with pytest.raises(InputFileError, match=r"no masks/\*.png"):
        LabelledDataset.open(bad)
