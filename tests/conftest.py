import os
import random
from pathlib import Path

# One thread per test process, and per process a test starts (torchrun's ranks inherit it): the
# suite runs in parallel processes (pytest -n auto), and more threads than cores only wait.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Inductor compiles the decode step's graphs in this process rather than in a pool of its own
# (which would take the other core from the parallel test process and its torchrun ranks).
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import settings  # noqa: E402

from bytemtp.runtime import standin  # noqa: E402

# the stand-in accelerator exists before any backward pass: autograd sizes its device queues once
standin.register()

torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

# Hypothesis draws the same examples on every run by default (profile "ci": derandomized, no
# example database), so a run fails only where the code changed and a failure in CI reproduces
# anywhere. HYPOTHESIS_PROFILE=dev explores instead: new random examples each run, failures kept in
# .hypothesis/ and tried first next time (a failure prints a @reproduce_failure line to pin it).
# Tests that set max_examples keep theirs; deadline=None: a slow machine is not a failure.
settings.register_profile("ci", derandomize=True, database=None, max_examples=50, deadline=None, print_blob=True)
settings.register_profile("dev", max_examples=50, deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_collection_modifyitems(config, items):
    """The modules that hold slow tests run first, each whole and in its own order, so that the
    longest tests start while every worker is busy and the suite does not end on one of them alone
    (its tail). Tests marked gpu run only where CUDA is available; everything else on the CPU."""
    slow_modules = {item.module.__name__ for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: item.module.__name__ not in slow_modules)  # stable: each module's order kept
    if torch.cuda.is_available():
        return
    no_gpu = pytest.mark.skip(reason="marked gpu: needs an NVIDIA GPU with CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(no_gpu)


def pytest_runtest_setup(item):
    """Tests marked bwrap need bubblewrap working here: without it they skip, with the reason; under
    CI=true they fail instead, unless BYTEMTP_ALLOW_NO_BWRAP=1 says this CI may go without it."""
    if item.get_closest_marker("bwrap") is None:
        return
    from bytemtp.evaluation.execution import bwrap_problem

    problem = bwrap_problem()
    if problem is None:
        return
    if os.environ.get("CI", "").lower() == "true" and os.environ.get("BYTEMTP_ALLOW_NO_BWRAP") != "1":
        pytest.fail(f"CI=true needs bubblewrap for this test: {problem}; "
                    "set BYTEMTP_ALLOW_NO_BWRAP=1 to let the bubblewrap tests skip", pytrace=False)
    pytest.skip(problem)


@pytest.fixture(autouse=True)
def compile_cache(tmp_path_factory, monkeypatch):
    """Each test's own inductor cache, and with it the compiled step's cost records
    (`compiled.record_path` lives under TORCHINDUCTOR_CACHE_DIR), inherited by the processes it
    starts: no test reads or writes the user's cache, and no test sees another's records."""
    folder = tmp_path_factory.mktemp("compile-cache")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(folder))
    return folder


@pytest.fixture
def one_thread():
    """Decoding runs thousands of tiny tensor ops; with an intra-op thread pool some of them
    (softmax) wait on the pool's other thread, which on a busy machine costs a scheduler tick
    each (seen: 30x slower). Decoding tests run single-threaded."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def code_corpus(tmp_path_factory):
    """A small prepared corpus of generated Python files, with a val split."""
    from bytemtp.data.prep import prepare

    root = tmp_path_factory.mktemp("code")
    src = root / "src"
    src.mkdir()
    for i in range(60):
        (src / f"m{i}.py").write_text(f"def f{i}(x):\n    return x * {i} + {i * 7}  # {'pad ' * 10}\n" * (2 + i % 5))
    prepare([src], root / "corpus", val_fraction=0.2)
    return root / "corpus"


@pytest.fixture
def root(tmp_path):
    """For the guard and execution tests: a working directory (a real path, as the child's is) beside a file and a directory outside it."""
    (tmp_path / "work").mkdir()
    (tmp_path / "outside").mkdir()
    (tmp_path / "victim.txt").write_text("keep me")
    return os.path.realpath(tmp_path / "work")


# --- training runs (tests/train_runs.py has their helpers) -----------------------------------------

WORDS = ("the quick brown fox jumps over a lazy dog while every byte model predicts eight heads "
         "of future tokens from one shared trunk").split()


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory) -> Path:
    """A prepared corpus of 40 small documents with a train and a val split."""
    from bytemtp.data import prep

    root = tmp_path_factory.mktemp("train-corpus")
    src = root / "src"
    src.mkdir()
    rng = random.Random(0)
    for i in range(40):
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(40, 200)))
        (src / f"doc{i:02d}.txt").write_text(f"document {i}\n{words}\n")
    manifest = prep.prepare([src], root / "corpus", val_fraction=0.2)
    assert manifest["splits"]["val"]["documents"] > 0 and manifest["splits"]["train"]["documents"] > 20
    return root / "corpus"


@pytest.fixture
def short_run(tmp_path, corpus_dir) -> Path:
    """A run of two steps with its checkpoint."""
    from train_runs import tiny_cfg

    import bytemtp.training.train as train_lib
    from bytemtp.runtime.checkpoint import latest_checkpoint

    run = tmp_path / "short"
    train_lib.train(tiny_cfg(corpus_dir, "train.steps=2"), run, show_progress=False, say=lambda m: None)
    assert latest_checkpoint(run) is not None
    return run
