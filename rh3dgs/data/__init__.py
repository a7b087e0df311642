"""Datasets: procedural labelled scenes (:mod:`rh3dgs.data.synthetic`), the labelled-dataset reader
(:mod:`rh3dgs.data.labelled`), the simulated teacher (:mod:`rh3dgs.data.teacher_sim`) and benchmark
readers (:mod:`rh3dgs.data.readers`)."""
