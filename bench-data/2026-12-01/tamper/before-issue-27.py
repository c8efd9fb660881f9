import sys, tempfile, shutil
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in type(f).__module__.lower() and "skbuild" not in type(f).__module__.lower() and "scikit" not in type(f).__module__.lower()]
sys.path.insert(0, "/tmp/tamper-oldsrc"); sys.path.insert(1, "/work/wt-tamper/tests")
from pathlib import Path
import bmoe_edge; print("code from", bmoe_edge.__file__)
from bmoe_edge.fleet import deploy, emulated_board
from bmoe_edge.fleet import targets as ft
import test_tamper as T   # the scenario builders (they use only bundle/signing/yaml)
work = Path(tempfile.mkdtemp(prefix="tamper-oldproof-")); work.chmod(0o700)
canary = work / "canary"
d = T.make_wrapper(Path("/tmp/tamper-dist/qemu-arm64"), work / "w", canary)
b = emulated_board.start(work / "lab", "old")
try:
    [r] = deploy.deploy(d, [ft.parse_target(b.target)], ssh_config=b.ssh_config, install_dir=str(work / "inst"), log=lambda m: None)
    print("deploy ok:", r.ok, "|", (r.error or "")[:160])
    print("canary created by the payload:", canary.exists())
finally:
    emulated_board.stop(work / "lab", "old")
