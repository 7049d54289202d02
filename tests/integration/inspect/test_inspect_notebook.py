"""``examples/inspect_trajectories.ipynb`` runs top to bottom in a real Jupyter kernel (nbclient)
against a run folder this test session made, and shows what it promises."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

NOTEBOOK = Path(__file__).resolve().parents[3] / "examples" / "inspect_trajectories.ipynb"


def test_notebook_executes_against_a_real_run(fake_run_dir: Path, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    # a kernel spec for this very interpreter (a bare "python" on PATH may be another one)
    spec = tmp_path / "jupyter" / "kernels" / "agentrl-test"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "agentrl test", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("AGENTRL_RUN_DIR", str(fake_run_dir))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(nb, kernel_name="agentrl-test", timeout=120, resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError on the first failing cell
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    html = [o["data"]["text/html"] for o in outputs if "text/html" in o.get("data", {})]
    assert any('class="grid"' in h and "tokens by provenance" in h for h in html)  # the index table
    assert any('class="seg k-model tr"' in h and "data-l=" in h for h in html)  # an episode with token texts
    assert any(h.count('class="member"') == 2 for h in html)  # the group of 2, side by side
    text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    assert "RunIndex(12 episodes" in text and "index.html" in text
