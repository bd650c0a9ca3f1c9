"""Type-check dashboard JSON against Grafana's own published types (@grafana/schema 11.6).

Grafana accepts almost any JSON on import and then shows "No data" or drops options it does
not know; TypeScript with `--strict` catches a wrong type or a misspelt field first. Each
dashboard is checked as a whole (`Dashboard`, with Prometheus annotation targets), and each
panel again against its plugin's own `Options` and `FieldConfig`. Grafana's types use TS
enums, which JSON strings never satisfy, so the check maps every enum to the union of its
string values (`Json<T>`). The npm packages live in dashboards/typecheck (`npm ci` there;
scripts/setup.sh does it).
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["TYPECHECK_DIR", "PANEL_TYPES", "tsc_path", "check_dashboards", "wrapper"]

TYPECHECK_DIR = Path(__file__).resolve().parents[2] / "dashboards" / "typecheck"

# Grafana panel plugin id -> (its generated types module under @grafana/schema/dist/esm/raw,
# whether that module declares a custom FieldConfig).
PANEL_TYPES = {
    "timeseries": ("timeseries/panelcfg/x/TimeSeriesPanelCfg_types.gen", True),
    "stat": ("stat/panelcfg/x/StatPanelCfg_types.gen", False),
    "bargauge": ("bargauge/panelcfg/x/BarGaugePanelCfg_types.gen", False),
    "state-timeline": ("statetimeline/panelcfg/x/StateTimelinePanelCfg_types.gen", True),
}

_PRELUDE = """\
import type { AnnotationQuery, Dashboard, DataQuery, Panel } from "@grafana/schema";
{imports}
type Json<T> = T extends string
  ? `${T}`
  : T extends (infer U)[]
    ? Json<U>[]
    : T extends object
      ? { [K in keyof T]: Json<T[K]> }
      : T;
// The Prometheus data source's query (Grafana's prometheus plugin, dataquery.cue).
interface PrometheusQuery extends DataQuery {
  expr: string;
  legendFormat?: string;
  range?: boolean;
  instant?: boolean;
  format?: "time_series" | "table" | "heatmap";
  editorMode?: "code" | "builder";
  exemplar?: boolean;
  interval?: string;
  intervalFactor?: number;
}
type Checked = Omit<Dashboard, "annotations"> & {
  annotations?: { list?: AnnotationQuery<PrometheusQuery>[] };
};
type Typed<O, F> = Omit<Panel<O, F>, "options" | "targets"> & {
  options?: O;
  targets?: PrometheusQuery[];
};
"""


def tsc_path() -> Path:
    tsc = TYPECHECK_DIR / "node_modules" / ".bin" / "tsc"
    if not tsc.exists():
        raise FileNotFoundError(
            f"{tsc} is missing: run `npm ci --prefix {TYPECHECK_DIR}` (scripts/setup.sh does)"
        )
    return tsc


def wrapper(doc: dict[str, Any], source: str) -> str:
    """TypeScript that compiles only if `doc` fits Grafana's types."""
    panels = [p for p in doc.get("panels", []) if p.get("type") != "row"]
    unknown = sorted({p["type"] for p in panels} - set(PANEL_TYPES))
    if unknown:
        raise ValueError(f"{source}: no panel types known for {', '.join(unknown)}")
    used = sorted({p["type"] for p in panels})
    imports = "\n".join(
        f'import type * as P{i} from "@grafana/schema/dist/esm/raw/composable/{PANEL_TYPES[t][0]}";'
        for i, t in enumerate(used)
    )
    out = [_PRELUDE.replace("{imports}", imports), f"// {source}"]
    out.append(f"export const dashboard: Json<Checked> = {json.dumps(doc, indent=2)};")
    for p in panels:
        ns = f"P{used.index(p['type'])}"
        custom = f"{ns}.FieldConfig" if PANEL_TYPES[p["type"]][1] else "Record<string, unknown>"
        out.append(
            f"export const panel{p.get('id')}: Json<Typed<{ns}.Options, {custom}>> = "
            f"{json.dumps(p, indent=2)};"
        )
    return "\n".join(out) + "\n"


def check_dashboards(paths: list[Path]) -> str:
    """Runs tsc over every dashboard at once; returns its report, '' when all pass."""
    tsc = tsc_path()
    with tempfile.TemporaryDirectory(dir=TYPECHECK_DIR, prefix=".check-") as tmp:
        files = []
        for i, path in enumerate(paths):
            ts = Path(tmp) / f"d{i}_{path.stem.replace('-', '_')}.ts"
            ts.write_text(wrapper(json.loads(path.read_text()), str(path)))
            files.append(str(ts))
        p = subprocess.run(
            [str(tsc), "--noEmit", "--strict", "--skipLibCheck", "--moduleResolution", "node",
             "--target", "es2020", *files],
            cwd=TYPECHECK_DIR, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    return "" if p.returncode == 0 else (p.stdout + p.stderr).strip()
