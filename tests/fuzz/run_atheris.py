"""Coverage-guided fuzzing of one rh3dgs parser with atheris (libFuzzer).

    python tests/fuzz/run_atheris.py TARGET [libFuzzer flags, e.g. -atheris_runs=2000 -max_total_time=60]

TARGET is a key of ``fuzz.targets.TARGETS`` (ply, ply_ascii, transforms, feature_npy,
feature_npz, feature_pt, text_embeddings, scene_json, scene_field, scene_ply). The
target's valid seed file is the starting corpus. Any exception other than an
``Rh3dgsError`` is reported by libFuzzer as a crash (non-zero exit, input saved as
``crash-*``); a call running over 10 s raises ``Hang`` (reported the same way). Do not pass
libFuzzer's ``-timeout``: its SIGALRM outlives the run and kills the interpreter at exit.
"""
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/

import atheris  # noqa: E402

with atheris.instrument_imports(include=["rh3dgs"]):
    import rh3dgs.api  # noqa: F401
    import rh3dgs.io.ply  # noqa: F401
    import rh3dgs.io.transforms  # noqa: F401
    import rh3dgs.teachers.cache  # noqa: F401
    import rh3dgs.teachers.precomputed  # noqa: F401

from fuzz.targets import TARGETS, run_one, seeds  # noqa: E402


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in TARGETS:
        sys.exit(f"usage: run_atheris.py TARGET [libFuzzer flags]; targets: {', '.join(sorted(TARGETS))}")
    name = sys.argv.pop(1)
    corpus = tempfile.mkdtemp(prefix=f"rh3dgs_corpus_{name}_")
    with open(os.path.join(corpus, "seed"), "wb") as f:
        f.write(seeds()[name])
    counter = {"n": 0}

    def one_input(data: bytes) -> None:
        counter["n"] += 1
        run_one(name, data)  # a call over fuzz.targets.CALL_TIMEOUT_S raises Hang: reported as a crash

    atheris.Setup(sys.argv + [corpus], one_input)
    try:
        atheris.Fuzz()
    finally:
        print(f"rh3dgs atheris target {name}: {counter['n']} inputs", file=sys.stderr)


if __name__ == "__main__":
    main()
