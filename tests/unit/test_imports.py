"""The core (cluster, worker, channel, lock, flow, planner, CLI) imports without torch."""

import subprocess
import sys


def test_core_does_not_import_torch():
    code = (
        "import sys\n"
        "import loomrl, loomrl.cluster, loomrl.worker, loomrl.channel, loomrl.lock, loomrl.flow\n"
        "import loomrl.plan, loomrl.profiler, loomrl.cli, loomrl.run, loomrl.config, loomrl.transport\n"
        "import loomrl.agentic, loomrl.tools, loomrl.tasks.search_qa, loomrl.recipes.agentic_search\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
