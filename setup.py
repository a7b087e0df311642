"""Build rh3dgs and its native extension ``rh3dgs._C``.

The CPU kernels (C++ / OpenMP) are always built. CUDA kernels are added according to
``RH3DGS_BUILD_CUDA``:
  auto (default) - build them when torch is a CUDA build, nvcc is found AND a GPU is visible
                   (or TORCH_CUDA_ARCH_LIST is set, for building on a GPU-less machine);
  1              - always build them (fails if the toolchain is missing);
  0              - never build them.
nvcc is found in $CUDA_HOME, on PATH, or as the PyPI toolchain in this interpreter's environment
(``scripts/setup_system.sh cuda`` installs it where torch is a CUDA build and no toolkit is there;
see scripts/cuda_toolchain.py).
"""
import glob
import importlib.util
import os

from setuptools import find_packages, setup

ROOT = os.path.dirname(os.path.abspath(__file__))


def _toolchain_module():
    spec = importlib.util.spec_from_file_location("_rh3dgs_cuda_toolchain", os.path.join(ROOT, "scripts", "cuda_toolchain.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_TOOLCHAIN = _toolchain_module()
# Before torch's build helpers are imported: they read CUDA_HOME once, at import.
_CUDA_HOME, _CUDA_SOURCE = _TOOLCHAIN.find_cuda_home()
if _CUDA_HOME is not None:
    _TOOLCHAIN.use_cuda_home(_CUDA_HOME)


def _want_cuda() -> bool:
    flag = os.environ.get("RH3DGS_BUILD_CUDA", "auto").strip().lower()
    if flag in ("0", "false", "no", "off"):
        return False
    import torch

    toolchain = torch.version.cuda is not None and _CUDA_HOME is not None
    if flag in ("1", "true", "yes", "on"):
        if torch.version.cuda is None:
            raise RuntimeError(f"RH3DGS_BUILD_CUDA=1 but torch {torch.__version__} is not a CUDA build")
        if _CUDA_HOME is None:
            raise RuntimeError(f"RH3DGS_BUILD_CUDA=1 but {_CUDA_SOURCE}; run `scripts/setup_system.sh cuda` "
                               "(PYTHON=this interpreter) to install the PyPI toolchain, or install a CUDA toolkit")
        return True
    return toolchain and (torch.cuda.is_available() or bool(os.environ.get("TORCH_CUDA_ARCH_LIST")))


def _extensions():
    from torch.utils.cpp_extension import CppExtension, CUDAExtension

    sources = ["csrc/ext.cpp"] + sorted(glob.glob("csrc/cpu/*.cpp"))
    cxx = ["-O3", "-fopenmp"]
    # The extension is built where it runs (make install / pip install -e), so tune for this
    # CPU unless asked not to (RH3DGS_NATIVE_ARCH=0, e.g. for portable wheels).
    if os.environ.get("RH3DGS_NATIVE_ARCH", "1") != "0":
        cxx.append("-march=native")
    if _want_cuda():
        sources += sorted(glob.glob("csrc/cuda/*.cu"))
        return [
            CUDAExtension(
                "rh3dgs._C",
                sources,
                extra_compile_args={"cxx": cxx, "nvcc": ["-O3", "--use_fast_math"]},
                extra_link_args=["-fopenmp"],
            )
        ]
    return [CppExtension("rh3dgs._C", sources, extra_compile_args={"cxx": cxx}, extra_link_args=["-fopenmp"])]


def _cmdclass():
    from torch.utils.cpp_extension import BuildExtension

    class Build(BuildExtension):
        """torch's BuildExtension (ninja); with a toolkit that ships only ``libcudart.so.<major>`` (the PyPI
        runtime), ``-lcudart`` finds it through a link in the build folder."""

        def build_extensions(self):
            cudart = _TOOLCHAIN.linkable_cudart(_CUDA_HOME) if _CUDA_HOME else None
            if cudart and any(e.name == "rh3dgs._C" and any(s.endswith(".cu") for s in e.sources)
                              for e in self.extensions):
                link_dir = os.path.join(os.path.abspath(self.build_temp), "cudart")
                os.makedirs(link_dir, exist_ok=True)
                link = os.path.join(link_dir, "libcudart.so")
                if os.path.lexists(link):
                    os.remove(link)
                os.symlink(cudart, link)
                for ext in self.extensions:
                    ext.library_dirs.append(link_dir)
            super().build_extensions()

    return {"build_ext": Build.with_options(use_ninja=True)}


setup(
    name="rh3dgs",
    version="0.1.0",
    description="Robust open-vocabulary semantic 3D Gaussian Splatting (Rh-3DGS) with CPU and CUDA kernels",
    long_description=open(os.path.join(ROOT, "README.md")).read() if os.path.exists(os.path.join(ROOT, "README.md")) else "",
    long_description_content_type="text/markdown",
    packages=find_packages(include=["rh3dgs", "rh3dgs.*"]),
    python_requires=">=3.10",
    install_requires=[
        "torch>=2.4",
        "numpy",
        "scipy",
        "plyfile>=1.0",
        "pillow",
        "matplotlib",  # result sheets (rh3dgs.viz)
        "geoopt>=0.5",
        "rich",
        "tqdm",
        "pyyaml",
        "tyro>=1.0.17,<1.1",  # the rh3dgs command line (rh3dgs.cli reads tyro 1.0's parse-error events)
    ],
    extras_require={
        "nerfstudio": ["nerfstudio==1.1.5", "gsplat==1.4.0"],
        "clip": ["open_clip_torch"],
        "test": ["pytest", "hypothesis"],
    },
    entry_points={
        "console_scripts": ["rh3dgs=rh3dgs.cli:main"],
        "nerfstudio.method_configs": [
            "rh3dgs = rh3dgs.nerfstudio.config:rh3dgs_method",
            "rh3dgs-lite = rh3dgs.nerfstudio.config:rh3dgs_lite_method",
            "splatfacto-native = rh3dgs.nerfstudio.config:splatfacto_native_method",
            "splatfacto-native-lite = rh3dgs.nerfstudio.config:splatfacto_native_lite_method",
        ],
    },
    ext_modules=_extensions(),
    cmdclass=_cmdclass(),
    zip_safe=False,
)
