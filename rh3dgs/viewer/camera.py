"""viser's browser camera <-> :class:`rh3dgs.Cameras` (no viser import needed).

viser (0.2.7, ``client.camera``) reports the camera pose in the OpenCV convention:
``wxyz`` is the rotation R and ``position`` the translation t of ``P_world = [R | t] p_camera``
(camera x right, y down, z forward); ``fov`` is the *vertical* field of view in radians and
``aspect`` the canvas width / height. That is exactly gsplat's convention once inverted, so
``viewmat = inv([R | t])``. (nerfstudio's viewer multiplies by ``SO3.from_x_radians(pi)``
to get its OpenGL camera-to-world and divides positions by ``VISER_NERFSTUDIO_SCALE_RATIO``;
we render in scene units directly, so neither applies here.) Intrinsics follow nerfstudio's
``viewer.utils.get_camera``: ``fy = fx = (H / 2) / tan(fov / 2)``, principal point at the
image centre.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence, Tuple

import numpy as np
import torch

from ..cameras import Cameras
from ..errors import ShapeError

__all__ = ["ViewPose", "quat_to_matrix", "matrix_to_quat", "image_size", "cameras_from_viser", "pose_from_cameras"]


def quat_to_matrix(wxyz: Sequence[float]) -> np.ndarray:
    """Unit (w, x, y, z) quaternion -> [3, 3] rotation matrix (normalises the input)."""
    q = np.asarray(wxyz, dtype=np.float64).reshape(4)
    n = np.linalg.norm(q)
    if not np.isfinite(n) or n < 1e-12:
        raise ShapeError(f"camera quaternion must be finite and non-zero, got {q.tolist()}")
    w, x, y, z = q / n
    return np.array([
        [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
        [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
        [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
    ])


def matrix_to_quat(R: np.ndarray) -> np.ndarray:
    """[3, 3] rotation matrix -> (w, x, y, z) with w >= 0 (Shepperd's method)."""
    R = np.asarray(R, dtype=np.float64)
    tr = np.trace(R)
    if tr > 0:
        s = math.sqrt(tr + 1.0) * 2
        q = [0.25 * s, (R[2, 1] - R[1, 2]) / s, (R[0, 2] - R[2, 0]) / s, (R[1, 0] - R[0, 1]) / s]
    elif R[0, 0] > R[1, 1] and R[0, 0] > R[2, 2]:
        s = math.sqrt(1.0 + R[0, 0] - R[1, 1] - R[2, 2]) * 2
        q = [(R[2, 1] - R[1, 2]) / s, 0.25 * s, (R[0, 1] + R[1, 0]) / s, (R[0, 2] + R[2, 0]) / s]
    elif R[1, 1] > R[2, 2]:
        s = math.sqrt(1.0 + R[1, 1] - R[0, 0] - R[2, 2]) * 2
        q = [(R[0, 2] - R[2, 0]) / s, (R[0, 1] + R[1, 0]) / s, 0.25 * s, (R[1, 2] + R[2, 1]) / s]
    else:
        s = math.sqrt(1.0 + R[2, 2] - R[0, 0] - R[1, 1]) * 2
        q = [(R[1, 0] - R[0, 1]) / s, (R[0, 2] + R[2, 0]) / s, (R[1, 2] + R[2, 1]) / s, 0.25 * s]
    q = np.asarray(q)
    q /= np.linalg.norm(q)
    return -q if q[0] < 0 else q


def image_size(aspect: float, resolution: int) -> Tuple[int, int]:
    """(width, height) with the longer side = ``resolution`` and width / height ~= ``aspect``."""
    if not (aspect > 0 and math.isfinite(aspect)):
        aspect = 1.0
    resolution = max(8, int(resolution))
    if aspect >= 1.0:
        return resolution, max(8, int(round(resolution / aspect)))
    return max(8, int(round(resolution * aspect))), resolution


def cameras_from_viser(wxyz: Sequence[float], position: Sequence[float], fov: float, aspect: float,
                       resolution: int) -> Cameras:
    """One :class:`Cameras` for a viser camera state, rendered at ``resolution`` pixels on the long side.

    Args:
        wxyz: camera-to-world rotation (OpenCV axes), viser's ``client.camera.wxyz``.
        position: camera centre in world coordinates (``client.camera.position``).
        fov: vertical field of view in radians (``client.camera.fov``).
        aspect: canvas width / height (``client.camera.aspect``).
        resolution: pixels on the longer image side.
    """
    if not (0 < fov < math.pi):
        raise ShapeError(f"vertical field of view must be in (0, pi) radians, got {fov}")
    W, H = image_size(aspect, resolution)
    c2w = np.eye(4)
    c2w[:3, :3] = quat_to_matrix(wxyz)
    c2w[:3, 3] = np.asarray(position, dtype=np.float64).reshape(3)
    viewmat = np.linalg.inv(c2w)
    f = (H / 2.0) / math.tan(fov / 2.0)
    K = np.array([[f, 0.0, W / 2.0], [0.0, f, H / 2.0], [0.0, 0.0, 1.0]])
    return Cameras(viewmats=torch.from_numpy(viewmat).float()[None], Ks=torch.from_numpy(K).float()[None],
                   width=W, height=H)


@dataclass
class ViewPose:
    """A viser camera state: ``wxyz``, ``position``, vertical ``fov`` (rad), ``look_at``, ``up`` (world)."""

    wxyz: np.ndarray
    position: np.ndarray
    fov: float
    look_at: np.ndarray
    up: np.ndarray


def pose_from_cameras(cameras: Cameras, index: int = 0, target_distance: float = 1.0) -> ViewPose:
    """The viser camera state that looks like ``cameras[index]`` (inverse of :func:`cameras_from_viser`).

    ``look_at`` is ``target_distance`` along the optical axis; ``up`` is the camera's -y axis.
    """
    viewmat = cameras.viewmats[index].detach().double().cpu().numpy()
    c2w = np.linalg.inv(viewmat)
    R, t = c2w[:3, :3], c2w[:3, 3]
    fy = float(cameras.Ks[index, 1, 1])
    fov = 2.0 * math.atan((cameras.height / 2.0) / fy)
    return ViewPose(matrix_to_quat(R), t.copy(), fov, t + R[:, 2] * float(target_distance), -R[:, 1].copy())
