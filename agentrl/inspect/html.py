"""One trajectory (or every sequence of an episode) as self-contained HTML.

The page shows the conversation turn by turn as the token buffer holds it: every segment is a
block coloured by its provenance (prompt / model / tool / user / scaffold, see
:data:`~agentrl.inspect.PROVENANCE_COLOURS`) with a solid edge when it is trained on and a
hatched one for a model segment masked out; its header gives the turn, the span, the weight
version and finish reason of a model turn and its mean and lowest logprob. Tool calls sit under
the turn that made them with their arguments, result, failure kind and duration. Toggles show
token boundaries, token ids, logprobs and a logprob heat map over the model's tokens; for a
mixture-of-experts trajectory, "routing" underlines the positions without the engine's routing
(dotted) and, when the trajectory carries a ``routing_differs`` channel
(:func:`agentrl.train.moe.mark_routing_differences`), the positions where the trainer's router chose
other experts than the engine (red); hovering shows the engine's experts per layer. The
episode's outcome (status, stop reason, reward and its parts, failure counts, errors) heads the
page, and the sequences of a forked episode link to each other.

Everything is inline (CSS, one small script for token tooltips; a Content-Security-Policy that
allows nothing else), so a page works from a file on disk and inside Jupyter. All text from the
trajectory (model output, tool results, arguments) is HTML-escaped.

Example::

    page = episode_html(episode, decoder=token_decoder("model_dir"), full_page=True)
    Path("episode.html").write_text(page, encoding="utf-8")
"""

from __future__ import annotations

import html
import itertools
import json
import math
import os
import secrets
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agentrl.episode import Episode
from agentrl.inspect._style import CSS, PROVENANCE_COLOURS, SCRIPT, heat_class
from agentrl.inspect.calls import TurnCalls, calls_by_message, message_text
from agentrl.inspect.decode import TokenDecoder
from agentrl.token_data import ROUTED_EXPERTS, ROUTING_DIFFERS
from agentrl.trajectory import Segment, SegmentKind, Trajectory

__all__ = ["episode_html", "page", "trajectory_html", "write_viewer"]

_CSP = "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:"
_PREFIX = secrets.token_hex(3)
_COUNTER = itertools.count()
_MAX_RESULT_CHARS = 20_000
_MAX_NOTE_CHARS = 2_000


def _esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def _uid() -> str:
    return f"arl-{_PREFIX}-{next(_COUNTER)}"


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.4g}"
    return str(value)


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f"\u2026 [{len(text) - limit} more characters]"


def page(title: str, body: str) -> str:
    """A whole HTML document around ``body`` with the offline-only Content-Security-Policy."""
    return ("<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<meta http-equiv=\"Content-Security-Policy\" content=\"{_CSP}\"><title>{_esc(title)}</title>"
            "<style>body{margin:16px;background:#fff}</style></head><body>" + body + "</body></html>")


# -- tokens --------------------------------------------------------------------------------------
def _routing_marks(traj: Trajectory, seg: Segment) -> list[tuple[str, str]] | None:
    """Per token of ``seg``, the extra classes and data attributes of its MoE routing (None without routing)."""
    routing = traj.channels.get(ROUTED_EXPERTS)
    if routing is None:
        return None
    differs = traj.channels.get(ROUTING_DIFFERS)
    out = []
    for p in range(seg.start, seg.end):
        if not routing.present[p]:
            out.append((" nr", ' data-x="no engine routing"'))
            continue
        experts = "; ".join(f"L{layer}: {','.join(map(str, row))}" for layer, row in enumerate(routing.values[p].tolist()))
        attrs = f' data-x="{experts}"'
        if differs is not None and differs.present[p] and int(differs.values[p]) > 0:
            out.append((" rd", f'{attrs} data-d="{int(differs.values[p])}"'))
        else:
            out.append(("", attrs))
    return out


def _token_spans(traj: Trajectory, seg: Segment, texts: Sequence[str] | None) -> str:
    ids = traj.tokens[seg.start:seg.end]
    model = seg.kind is SegmentKind.MODEL
    lps = traj.logprobs[seg.start - traj.prompt_length:seg.end - traj.prompt_length] if model else ()
    marks = _routing_marks(traj, seg)
    parts = []
    for j, tid in enumerate(ids):
        text = _esc(texts[j]) if texts is not None else str(tid)
        cls, attrs = marks[j] if marks is not None else ("", "")
        if model:
            lp = lps[j]
            parts.append(f'<span class="t h{heat_class(lp)}{cls}" data-i="{tid}" data-l="{lp:.2f}"{attrs}>{text}</span>')
        else:
            parts.append(f'<span class="t{cls}" data-i="{tid}"{attrs}>{text}</span>')
    return "".join(parts)


def _logprob_note(traj: Trajectory, seg: Segment) -> str:
    lps = traj.logprobs[seg.start - traj.prompt_length:seg.end - traj.prompt_length]
    if not lps:
        return ""
    low = min(range(len(lps)), key=lps.__getitem__)
    return (f"<span>mean logprob {sum(lps) / len(lps):.3f}</span>"
            f"<span>lowest {lps[low]:.3f} at pos {seg.start + low}</span>")


# -- messages and calls --------------------------------------------------------------------------
def _message_html(index: int, message: Any) -> str:
    head = f'<span class="role">{_esc(message.role)}</span> <span class="note">#{index}</span>'
    if message.name:
        head += f" {_esc(message.name)}"
    body = ""
    if message.reasoning_content:
        body += f'<div class="think">{_esc(message.reasoning_content)}</div>'
    body += _esc(_clip(message_text(message), _MAX_RESULT_CHARS))
    for call in message.tool_calls:
        body += f"\n\u2192 {_esc(call.name)}({_esc(json.dumps(call.arguments, ensure_ascii=False))})"
    return f'<div class="msg">{head}\n{body}</div>'


def _calls_html(turn: TurnCalls) -> str:
    cards = []
    for call in turn.calls:
        err = " err" if call.result_is_error else ""
        head = f"<b>{_esc(call.name)}</b>"
        if call.call_id:
            head += f' <span class="note">{_esc(call.call_id)}</span>'
        if call.failure:
            head += f' <span class="fk">{_esc(call.failure)}</span>'
        if call.duration_s is not None:
            head += f" <span>{call.duration_s * 1e3:.1f} ms</span>"
        args = json.dumps(call.arguments, ensure_ascii=False, indent=1)
        result = ("<i>no result in the conversation</i>" if call.result is None
                  else f"<pre>{_esc(_clip(call.result, _MAX_RESULT_CHARS))}</pre>")
        cards.append(f'<div class="call{err}">{head}<div>arguments</div><pre>{_esc(args)}</pre>'
                     f"<div>result</div>{result}</div>")
    for f in turn.parse_failures:
        tol = " (tolerated)" if f.get("tolerated") else ""
        cards.append(f'<div class="call err"><span class="fk">{_esc(f.get("kind"))}</span>{tol} '
                     f'{_esc(f.get("tool") or "")}<pre>{_esc(_clip(str(f.get("message", "")), 2000))}</pre></div>')
    return f'<div class="calls">{"".join(cards)}</div>' if cards else ""


def _message_ranges(traj: Trajectory) -> dict[int, range]:
    """Per segment index, the messages it is the first segment to render."""
    out: dict[int, range] = {}
    model_at = [(i, s.message_index) for i, s in enumerate(traj.segments)
                if s.kind is SegmentKind.MODEL and s.message_index is not None]
    seen: set[int] = set()
    n = len(traj.messages)
    for i, seg in enumerate(traj.segments):
        if seg.kind is SegmentKind.MODEL:
            mi = seg.message_index
            if mi is not None and mi < n and mi not in seen:
                out[i] = range(mi, mi + 1)
                seen.add(mi)
            continue
        start = 0 if seg.kind is SegmentKind.PROMPT else seg.message_index
        if start is None or start in seen:
            continue
        end = next((m for j, m in model_at if j > i and m is not None), n)
        out[i] = range(start, max(start, min(end, n)))
        seen.update(out[i])
    return out


# -- segments and sequences ----------------------------------------------------------------------
def _segment_html(traj: Trajectory, i: int, seg: Segment, texts: Sequence[str] | None,
                  messages: range | None, calls: Mapping[int, TurnCalls]) -> str:
    kind = seg.kind.value
    trained = "tr" if seg.trainable else "nt"
    head = [f'<span class="badge b-{kind}">{kind}</span>',
            f'<span class="badge b-{trained}">{"trained" if seg.trainable else "not trained"}</span>',
            f"<span>turn {seg.turn}</span>", f"<span>{seg.length} tokens [{seg.start}, {seg.end})</span>"]
    if seg.message_index is not None:
        head.append(f"<span>message #{seg.message_index}</span>")
    if seg.kind is SegmentKind.MODEL:
        head.append(f"<span>weights {_esc(seg.weight_version or '?')}</span>")
        head.append(f"<span>finish {_esc(seg.finish_reason or '?')}</span>")
        head.append(_logprob_note(traj, seg))
    body = []
    spans = _token_spans(traj, seg, texts)
    if texts is not None:
        body.append(f'<div class="toks" data-s="{seg.start}">{spans}</div>')
    else:
        body.extend(_message_html(m, traj.messages[m]) for m in (messages or ()))
        body.append(f'<div class="toks ids" data-s="{seg.start}">{spans}</div>')
    if seg.kind is SegmentKind.MODEL and seg.message_index in calls:
        body.append(_calls_html(calls[seg.message_index]))  # type: ignore[index]
    return (f'<div class="seg k-{kind} {trained}"><div class="sh">{"".join(head)}</div>'
            + "".join(body) + "</div>")


def _kv(rows: Sequence[tuple[str, str]]) -> str:
    return '<table class="kv">' + "".join(f"<tr><th>{_esc(k)}</th><td>{v}</td></tr>" for k, v in rows) + "</table>"


def _versions(traj: Trajectory) -> str:
    by_version: dict[str, list[int]] = {}
    for s in traj.segments_of(SegmentKind.MODEL):
        by_version.setdefault(s.weight_version or "?", []).append(s.turn)
    return ", ".join(f"{_esc(v)} (turns {', '.join(map(str, turns))})" for v, turns in by_version.items()) or "-"


def _outcome_rows(traj: Trajectory) -> list[tuple[str, str]]:
    parts = ", ".join(f"{_esc(k)} {_fmt(v)}" for k, v in traj.reward_parts.items())
    failures = {k: v for k, v in traj.metrics.items() if k.startswith(("failures/", "tolerated/"))}
    rows = [("status", f"{_esc(traj.status.value)} · stop reason "
                       f"<b>{_esc(traj.stop_reason.value if traj.stop_reason else '-')}</b>"),
            ("reward", f"<b>{_fmt(traj.reward) if traj.reward is not None else '-'}</b>" + (f" ({parts})" if parts else "")),
            ("tokens", f"{traj.prompt_length} prompt · {traj.response_length} response · "
                       f"{traj.num_trainable_tokens} trained · {traj.num_model_turns} model turns"),
            ("weight versions", _versions(traj)),
            ("failures", ", ".join(f'<span class="fk">{_esc(k.split("/", 1)[1])}</span>'
                                   f'{" (tolerated)" if k.startswith("tolerated/") else ""} ×{_fmt(v)}'
                                   for k, v in failures.items()) or "none"),
            ("errors", "<br>".join(f'<span class="fk">{_esc(e.kind.value)}</span> <i>{_esc(e.where)}</i> '
                                   f'<span class="note">{_esc(_clip(e.message, _MAX_NOTE_CHARS))}</span>'
                                   for e in traj.errors) or "none")]
    ids = [(k, getattr(traj, k)) for k in ("group_id", "rollout_id", "sample_id", "session_id")]
    rows.append(("ids", " · ".join(f"{k} {_esc(v)}" for k, v in ids if v is not None) or "-"))
    other = {k: v for k, v in traj.metrics.items() if k not in failures}
    if other:
        rows.append(("metrics", " · ".join(f"{_esc(k)} {_fmt(v)}" for k, v in other.items())))
    for key, value in traj.info.items():
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
        rows.append((key, f'<span class="note">{_esc(_clip(text, _MAX_NOTE_CHARS))}</span>'))
    return rows


def _sequence_html(uid: str, traj: Trajectory, n_sequences: int, decoder: TokenDecoder | None,
                   calls: Mapping[int, TurnCalls]) -> str:
    texts = decoder(traj.tokens) if decoder is not None and traj.tokens else None
    ranges = _message_ranges(traj)
    segs = [_segment_html(traj, i, s, texts[s.start:s.end] if texts is not None else None, ranges.get(i), calls)
            for i, s in enumerate(traj.segments)]
    if traj.message_level:
        segs = [_message_html(i, m) for i, m in enumerate(traj.messages)]
    k = traj.sequence_index
    nav = ""
    if n_sequences > 1:
        links = [f'<a href="#{uid}-seq{j}">sequence {j}</a>' if j != k else f"<b>sequence {j}</b>"
                 for j in range(n_sequences)]
        nav = f'<div class="nav">forks of this episode: {" ".join(links)}</div>'
        if "forked_because" in traj.info:
            nav += (f'<div class="note">forked from sequence {k - 1} (a fresh render of the conversation): '
                    f'{_esc(traj.info["forked_because"])}</div>')
        nav += _compaction_note(traj)
    title = f"sequence {k} of {n_sequences}" if n_sequences > 1 else "trajectory"
    return (f'<section id="{uid}-seq{k}"><h3>{title}</h3>{nav}{_kv(_outcome_rows(traj))}'
            + "".join(segs) + "</section>")


def _compaction_note(traj: Trajectory) -> str:
    """Where a context policy compacted the episode: the policy, the prompt before and after, the summary."""
    out = ""
    record = traj.info.get("compaction")
    if isinstance(record, dict):
        what = (f'compaction ({_esc(str(record.get("policy")))}) of sequence {_esc(str(record.get("from_sequence")))}: '
                f'the next request would have held {_esc(str(record.get("tokens_before")))} tokens; this sequence starts '
                f'from {_esc(str(record.get("tokens_after")))}')
        if record.get("summary") is not None:
            trained = "" if record.get("summary_trained", True) else " (not trained)"
            what += f'; summary{trained}: <b>{_esc(_clip(str(record["summary"]), _MAX_NOTE_CHARS))}</b>'
        out += f'<div class="note">{what}</div>'
    turn = traj.info.get("summary_turn")
    if isinstance(turn, dict):
        out += (f'<div class="note">this sequence ends with the summary the policy wrote (message '
                f'{_esc(str(turn.get("message_index")))}, {_esc(str(turn.get("tokens")))} tokens, '
                f'{"trained" if turn.get("trained") else "masked out of the loss"})</div>')
    return out


def _legend() -> str:
    kinds = "".join(f'<span><span class="sw sw-{k}"></span>{k}</span>' for k in PROVENANCE_COLOURS)
    heat = "".join(f'<span class="hk hk{i}"></span>' for i in range(7))
    return (f"{kinds}<span><span class=\"badge b-tr\">trained</span> / <span class=\"badge b-nt\">not trained</span>"
            f"</span><span>logprob high {heat} low</span>")


def _viewer(sequences: Sequence[Trajectory], env_info: Sequence[Mapping[str, Any]], decoder: TokenDecoder | None,
            title: str) -> str:
    uid = _uid()
    last = sequences[-1]
    calls = calls_by_message(last.messages, env_info)
    names = [("b", "token boundaries"), ("i", "token ids"), ("l", "logprobs"), ("h", "logprob heat map")]
    if any(ROUTED_EXPERTS in s.channels for s in sequences):
        names.append(("r", "routing"))
    toggles = "".join(f'<input type="checkbox" class="tg tg-{c}" id="{uid}-{c}">' for c, _ in names)
    labels = "".join(f'<label class="lb-{c}" for="{uid}-{c}">{name}</label>' for c, name in names)
    note = "" if decoder is not None else ('<span class="note">no tokenizer given: segments show their messages; '
                                           "the toggles show the token ids</span>")
    body = "".join(_sequence_html(uid, s, len(sequences), decoder, calls) for s in sequences)
    return (f'<div class="arl" id="{uid}"><style>{CSS}</style>{toggles}<h2>{_esc(title)}</h2>'
            f'<div class="bar">{labels}{_legend()}{note}</div><div class="arl-body">{body}</div>'
            f'<div class="tip"></div><script>{SCRIPT % json.dumps(uid)}</script></div>')


def _title(traj: Trajectory) -> str:
    who = traj.sample_id or traj.rollout_id or "episode"
    reward = f" · reward {_fmt(traj.reward)}" if traj.reward is not None else ""
    return f"{who} · {traj.status.value}{reward}"


def trajectory_html(traj: Trajectory, *, decoder: TokenDecoder | None = None,
                    env_info: Sequence[Mapping[str, Any]] = (), full_page: bool = False, title: str | None = None) -> str:
    """One trajectory as an HTML fragment (``full_page``: a whole document). ``decoder`` gives the
    token texts (see :func:`~agentrl.inspect.token_decoder`); without it segments show their messages."""
    body = _viewer([traj], env_info, decoder, title or _title(traj))
    return page(title or _title(traj), body) if full_page else body


def episode_html(episode: Episode, *, decoder: TokenDecoder | None = None, full_page: bool = False,
                 title: str | None = None) -> str:
    """Every sequence of ``episode`` (linked to each other when it forked) as HTML; see :func:`trajectory_html`."""
    name = title or _title(episode.trajectory)
    body = _viewer(episode.sequences, episode.env_info, decoder, name)
    return page(name, body) if full_page else body


def write_viewer(item: Trajectory | Episode, path: str | os.PathLike[str], *,
                 decoder: TokenDecoder | None = None) -> Path:
    """Writes the viewer page of a trajectory or an episode to ``path``; returns the path."""
    out = Path(path)
    text = episode_html(item, decoder=decoder, full_page=True) if isinstance(item, Episode) else \
        trajectory_html(item, decoder=decoder, full_page=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    return out
