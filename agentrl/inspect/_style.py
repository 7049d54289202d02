"""The viewer's inline CSS and script (no network, no CDN), scoped under ``.arl`` so that several
viewers and a notebook's own styles live side by side. The toggles are plain checkboxes read by
CSS sibling selectors: everything but the token tooltip works with scripts disabled."""

from __future__ import annotations

__all__ = ["CSS", "HEAT_THRESHOLDS", "PROVENANCE_COLOURS", "SCRIPT", "heat_class"]

# kind -> (background, border); the border colour marks the span's provenance, the background
# is a pale version of it. Trainable spans get a solid border, masked model spans a hatched one.
PROVENANCE_COLOURS: dict[str, tuple[str, str]] = {
    "prompt": ("#eef0fb", "#5c6bc0"),
    "model": ("#e8f5e9", "#2e7d32"),
    "tool": ("#fff4e0", "#ef8f00"),
    "user": ("#e3f0ff", "#1e63d6"),
    "scaffold": ("#f1f1f1", "#8d8d8d"),
}

# logprob thresholds of the heat map's buckets h0 (likely) .. h6 (below the last threshold)
HEAT_THRESHOLDS: tuple[float, ...] = (-0.05, -0.2, -0.5, -1.0, -2.0, -4.0)
_HEAT = ("#f7fcf5", "#fde0dd", "#fcc5c0", "#fa9fb5", "#f768a1", "#dd3497", "#ae017e")


def heat_class(logprob: float) -> int:
    """The heat-map bucket of a logprob: 0 for near-certain tokens, 6 for the least likely."""
    for i, threshold in enumerate(HEAT_THRESHOLDS):
        if logprob > threshold:
            return i
    return len(HEAT_THRESHOLDS)


def _kind_rules() -> str:
    rules = []
    for kind, (bg, border) in PROVENANCE_COLOURS.items():
        rules.append(f".arl .k-{kind}{{background:{bg};border-left-color:{border}}}"
                     f".arl .sw-{kind}{{background:{bg};border-color:{border}}}"
                     f".arl .b-{kind}{{background:{border};color:#fff}}")
    return "".join(rules)


def _heat_rules() -> str:
    rules = []
    for i, colour in enumerate(_HEAT):
        text = "color:#fff;" if i >= 5 else ""
        rules.append(f".arl .tg-h:checked~.arl-body .h{i}{{background:{colour};{text}}}"
                     f".arl .hk{i}{{background:{colour}}}")
    return "".join(rules)


CSS = """
.arl{font:13px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;color:#1d1d1f;max-width:1200px}
.arl *{box-sizing:border-box}
.arl h2{font-size:16px;margin:8px 0}.arl h3{font-size:14px;margin:6px 0}
.arl table.kv{border-collapse:collapse;margin:4px 0 8px}
.arl table.kv td,.arl table.kv th{padding:2px 10px 2px 0;text-align:left;vertical-align:top}
.arl table.kv th{color:#555;font-weight:600;white-space:nowrap}
.arl .tg{position:absolute;opacity:0;pointer-events:none}
.arl .bar{display:flex;flex-wrap:wrap;gap:6px 14px;align-items:center;padding:6px 8px;margin:6px 0;
  background:#fafafa;border:1px solid #ddd;border-radius:6px}
.arl .bar label{cursor:pointer;user-select:none;padding:1px 8px;border:1px solid #bbb;border-radius:10px}
.arl .tg-b:checked~.bar .lb-b,.arl .tg-i:checked~.bar .lb-i,.arl .tg-l:checked~.bar .lb-l,
.arl .tg-h:checked~.bar .lb-h,.arl .tg-r:checked~.bar .lb-r{background:#333;color:#fff;border-color:#333}
.arl .tg-r:checked~.arl-body .t.nr{text-decoration:underline dotted #777 2px}
.arl .tg-r:checked~.arl-body .t.rd{text-decoration:underline solid #c62828 3px}
.arl .sw{display:inline-block;width:14px;height:14px;border:3px solid;border-radius:3px;vertical-align:-2px;margin-right:3px}
.arl .hk{display:inline-block;width:12px;height:12px;vertical-align:-1px}
.arl .seg{border-left:8px solid;margin:6px 0;padding:4px 8px 6px;border-radius:3px}
.arl .seg.nt.k-model{background:repeating-linear-gradient(135deg,#e8f5e9 0 6px,#f7f7f7 6px 12px)}
.arl .sh{font-size:12px;color:#333;margin-bottom:3px;display:flex;flex-wrap:wrap;gap:4px 10px}
.arl .badge{font-size:11px;padding:0 6px;border-radius:8px;font-weight:600}
.arl .b-tr{background:#1b5e20;color:#fff}.arl .b-nt{background:#fff;color:#555;border:1px dashed #777}
.arl .toks{white-space:pre-wrap;word-break:break-word;font:12px/1.6 ui-monospace,SFMono-Regular,Menlo,monospace}
.arl .t{border-radius:2px}
.arl .tg-b:checked~.arl-body .t{box-shadow:inset 0 0 0 1px #9a9a9a;margin:0 1px}
.arl .tg-i:checked~.arl-body .t::after{content:attr(data-i);font-size:9px;color:#555;vertical-align:sub;margin-left:1px}
.arl .tg-l:checked~.arl-body .t[data-l]::before{content:attr(data-l);font-size:9px;color:#8a1c1c;vertical-align:super;margin-right:1px}
.arl .ids{display:none;margin-top:4px}
.arl .tg-i:checked~.arl-body .ids,.arl .tg-l:checked~.arl-body .ids,.arl .tg-h:checked~.arl-body .ids{display:block}
.arl .ids .t::after{content:none!important}
.arl .msg{white-space:pre-wrap;word-break:break-word;font:12px/1.5 ui-monospace,SFMono-Regular,Menlo,monospace}
.arl .role{font-weight:700;text-transform:uppercase;font-size:11px;color:#444}
.arl .think{color:#666;font-style:italic}
.arl .calls{margin:6px 0 2px;display:grid;gap:6px}
.arl .call{border:1px solid #d0d0d0;border-radius:6px;background:#fff;padding:4px 8px}
.arl .call.err{border-color:#c62828;background:#fff5f5}
.arl .call pre{margin:2px 0;white-space:pre-wrap;word-break:break-word;font:12px/1.4 ui-monospace,Menlo,monospace;
  max-height:24em;overflow:auto;background:#f6f6f6;padding:4px;border-radius:4px}
.arl .fk{color:#b71c1c;font-weight:700}
.arl .note{color:#8a4b00}
.arl .nav a{margin-right:10px}
.arl .tip{position:fixed;z-index:10;background:#222;color:#fff;font:11px ui-monospace,monospace;padding:3px 6px;
  border-radius:4px;pointer-events:none;display:none}
.arl table.grid{border-collapse:collapse;font-size:12px}
.arl table.grid th,.arl table.grid td{border:1px solid #ddd;padding:3px 6px;text-align:left;vertical-align:top}
.arl table.grid th{background:#f3f3f3}
.arl .num{text-align:right;font-variant-numeric:tabular-nums}
.arl .side{display:grid;grid-auto-flow:column;grid-auto-columns:minmax(260px,1fr);gap:8px;overflow-x:auto}
.arl .member{border:1px solid #ddd;border-radius:6px;padding:6px}
.arl .pos{color:#1b5e20;font-weight:700}.arl .neg{color:#b71c1c;font-weight:700}
""" + _kind_rules() + _heat_rules()

# Hovering a token shows its position, id and logprob; positions come from the segment's start.
SCRIPT = """
(function(){var root=document.getElementById(%s);if(!root)return;var tip=root.querySelector('.tip');
root.addEventListener('mouseover',function(e){var t=e.target;if(!t.classList||!t.classList.contains('t'))return;
var box=t.parentNode,start=+box.getAttribute('data-s'),i=Array.prototype.indexOf.call(box.children,t);
var s='pos '+(start+i)+' \\u00b7 id '+t.getAttribute('data-i');var lp=t.getAttribute('data-l');
if(lp!==null){s+=' \\u00b7 logprob '+lp+' \\u00b7 p '+Math.exp(+lp).toFixed(3);}
var x=t.getAttribute('data-x');if(x!==null){s+=' \\u00b7 experts '+x;}
var d=t.getAttribute('data-d');if(d!==null){s+=' \\u00b7 trainer routes differently in '+d+' layer(s)';}tip.textContent=s;
tip.style.display='block';tip.style.left=(e.clientX+12)+'px';tip.style.top=(e.clientY+12)+'px';});
root.addEventListener('mouseout',function(){tip.style.display='none';});})();
"""
