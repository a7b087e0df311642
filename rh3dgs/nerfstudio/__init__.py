"""nerfstudio integration of rh3dgs: ``ns-train rh3dgs`` / ``rh3dgs-lite`` (and their plain splatfacto twins
``splatfacto-native`` / ``splatfacto-native-lite``).

Modules (import them explicitly; importing this package does not import nerfstudio):

* :mod:`rh3dgs.nerfstudio.config`      MethodSpecifications ``rh3dgs_method``, ``rh3dgs_lite_method``,
  ``splatfacto_native_method``, ``splatfacto_native_lite_method``
* :mod:`rh3dgs.nerfstudio.splatfacto_native` ``SplatfactoNativeModel`` (splatfacto, runnable on CPU)
* :mod:`rh3dgs.nerfstudio.model`       ``Rh3dgsModel`` (``SplatfactoNativeModel`` + latents, decoder, losses)
* :mod:`rh3dgs.nerfstudio.dataparser`  ``Rh3dgsDataParser`` (nerfstudio-data, seed points via plyfile, no open3d)
* :mod:`rh3dgs.nerfstudio.datamanager` ``Rh3dgsDataManager`` (teacher maps in ``batch["teacher"]``)
* :mod:`rh3dgs.nerfstudio.pipeline`    ``Rh3dgsPipeline`` (semantic initialisation, the viewer's guard)
* :mod:`rh3dgs.nerfstudio.trainer`     ``Rh3dgsTrainer`` (atomic checkpoints, resume, early ETA)
* :mod:`rh3dgs.nerfstudio.run_guard`   nerfstudio's reads of a run's config.yml without code execution (installed
  when nerfstudio loads the method entry points, i.e. in every ns-* command)

Reading a trained run back (``load_nerfstudio_scene``, ``export_semantic_ply``, ``rh3dgs.load(config.yml)``)
is the core's job: :mod:`rh3dgs.io.nerfstudio_run`.
"""

METHOD_ENTRY_POINTS = (
    "rh3dgs = rh3dgs.nerfstudio.config:rh3dgs_method",
    "rh3dgs-lite = rh3dgs.nerfstudio.config:rh3dgs_lite_method",
    "splatfacto-native = rh3dgs.nerfstudio.config:splatfacto_native_method",
    "splatfacto-native-lite = rh3dgs.nerfstudio.config:splatfacto_native_lite_method",
)
"""Lines of setup.py's ``entry_points["nerfstudio.method_configs"]``."""

METHOD_CONFIGS_ENV = ",".join(e.replace(" ", "") for e in METHOD_ENTRY_POINTS)
"""Value for ``NERFSTUDIO_METHOD_CONFIGS`` (registration without the entry point)."""
