"""The paper's pieces as functions of tensors (no files, no training loop, no nerfstudio).

    sphere.py     geometry on the unit hypersphere: geodesic distance, Huber, robust Frechet means (geoopt)
    vcd.py        VCD: per-pixel reliability weights from the rasterization statistics
    vfm.py        VFM: the Riemannian Huber loss between rendered and teacher features, view-wise means
    lic.py        LIC: the 3D-neighbourhood consistency contrast over a radius graph of Gaussian centres
    objective.py  the one semantic objective (VCD + VFM + LIC + ray term) that distill() and ns-train train

The two jobs that use them are :mod:`rh3dgs.lifting` (training-free) and :mod:`rh3dgs.distill` /
``ns-train rh3dgs`` (trained).
"""
