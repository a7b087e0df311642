"""Datasets: procedural labelled scenes (:mod:`rh3dgs.data.synthetic`)."""
