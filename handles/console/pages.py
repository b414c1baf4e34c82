"""The console's HTML: plain string templates, every job-written value escaped by `esc`."""

from __future__ import annotations

import html
import json
from datetime import datetime
from importlib import resources
from typing import Any
from urllib.parse import urlencode

from handles.console.auth import Operator
from handles.console.operations import STATES, Filters, Overview
from handles.liveness import LeaseTiming, NodeContact, contact_text, node_contact
from handles.principal import readable
from handles.sealing import shown as sensitive_shown
from handles.states import Status
from handles.store import InputRequestRecord, JobRecord, StepRecord
from handles.store.models import claims_of


def esc(value: object) -> str:
    return html.escape("" if value is None else str(value), quote=True)


STYLE = (resources.files(__package__) / "static" / "console.css").read_text(encoding="utf-8")


def page(title: str, body: str, *, base: str, operator: Operator | None) -> str:
    nav = ""
    if operator is not None:
        logout = (
            f'<form method="post" action="{esc(base)}/logout">{csrf_field(operator)}<button>Sign out</button></form>'
            if operator.csrf is not None
            else ""
        )
        nav = (
            f'<a href="{esc(base)}/">Jobs</a><a href="{esc(base)}/overview">Overview</a>'
            f'<span class="who">{esc(operator.recorded_as)}</span>{logout}'
        )
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)} · handles console</title><style>{STYLE}</style></head>"
        f"<body><header><strong>handles console</strong>{nav}</header><main>{body}</main></body></html>"
    )


def csrf_field(operator: Operator) -> str:
    return f'<input type="hidden" name="csrf" value="{esc(operator.csrf)}">' if operator.csrf else ""


def login(base: str, next_path: str, problem: str | None = None) -> str:
    message = f'<p class="error">{esc(problem)}</p>' if problem else ""
    body = (
        '<div class="card" style="max-width:380px"><h1>Sign in</h1>'
        "<p class=muted>The operator token is HANDLES_CONSOLE_TOKEN of this console.</p>"
        f'{message}<form method="post" action="{esc(base)}/login">'
        f'<input type="hidden" name="next" value="{esc(next_path)}">'
        '<label for="name">Your name (recorded on what you answer and cancel)</label>'
        '<input id="name" name="name" required maxlength="100" autocomplete="username">'
        '<label for="token">Operator token</label>'
        '<input id="token" name="token" type="password" required autocomplete="current-password">'
        '<p><button class="primary">Sign in</button></p></form></div>'
    )
    return page("Sign in", body, base=base, operator=None)


def _age(seconds: float) -> str:
    """`42s`, `3m 05s`, `2h 10m`, `4d 3h`."""
    whole = int(max(seconds, 0))
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m {whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h {whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d {whole % 86400 // 3600}h"


def fraction(job: JobRecord) -> float | None:
    if job.progress_total:
        return min(max((job.progress_done or 0) / job.progress_total, 0.0), 1.0)
    return None


def row_data(job: JobRecord, now: datetime, base: str, timing: LeaseTiming) -> dict[str, Any]:
    """A jobs-table row as JSON for the live update (the script puts each value in as text)."""
    contact = node_contact(job.status, job.lease_expires_at, now, timing)
    claims = claims_of(job)  # "node": the one running it now, or the one that ran it last
    return {
        "id": job.id,
        "href": f"{base}/jobs/{job.id}",
        "kind": job.kind,
        "principal": readable(job.principal),
        "status": job.status,
        "message": job.status_message or "",
        "fraction": fraction(job),
        "done": job.progress_done,
        "age": _age((now - job.created_at).total_seconds()),
        "node": job.lease_owner or (claims[-1].node if claims else ""),
        "heard": "" if contact is None else contact_text(contact),
        "quiet": contact is not None and contact.quiet,
        "attempts": job.attempts,
    }


def _badge(status: str) -> str:
    return f'<span class="badge {esc(status)}">{esc(status)}</span>'


def _heard(text: str, quiet: bool, tag: str = "div") -> str:
    """When a job's node was last heard from: muted while it renews its leases, a warning once it is quiet."""
    return f'<{tag} class="{"quiet" if quiet else "muted"}">{esc(text)}</{tag}>'


def _bar(value: float | None, done: float | None) -> str:
    if value is None:
        return f'<span class="muted">{esc(f"{done:g}") if done is not None else "-"}</span>'
    return f'<span class="bar"><span style="width:{value * 100:.1f}%"></span></span><span class="pct">{value * 100:.0f}%</span>'


def _row(row: dict[str, Any]) -> str:
    return (
        f'<tr data-id="{esc(row["id"])}"><td><a class="mono" href="{esc(row["href"])}">{esc(row["id"][:12])}</a></td>'
        f"<td>{esc(row['kind'])}</td><td>{esc(row['principal'])}</td>"
        f'<td>{_badge(row["status"])}<div class="muted">{esc(row["message"])}</div></td>'
        f"<td>{_bar(row['fraction'], row['done'])}</td><td>{esc(row['age'])}</td>"
        f'<td><span class="mono">{esc(row["node"])}</span>{_heard(row["heard"], row["quiet"]) if row["heard"] else ""}</td>'
        f'<td class="num">{esc(row["attempts"])}</td></tr>'
    )


LIVE_SCRIPT = (resources.files(__package__) / "static" / "live.js").read_text(encoding="utf-8")


def jobs(
    rows: list[dict[str, Any]],
    filters: Filters,
    *,
    base: str,
    operator: Operator,
    feed: str,
    next_cursor: str | None,
    first_page: bool,
) -> str:
    status_options = "".join(
        f'<option value="{s.value}"{" selected" if filters.status == s.value else ""}>{s.value}</option>'
        for s in Status
    )
    kinds = sorted({row["kind"] for row in rows} | ({filters.kind} if filters.kind else set()))
    kind_options = "".join(f'<option value="{esc(k)}">' for k in kinds)
    form = (
        f'<form class="filters" method="get" action="{esc(base)}/">'
        f'<select name="status" aria-label="status"><option value="">any status</option>{status_options}</select>'
        f'<input name="kind" list="kinds" placeholder="job kind" value="{esc(filters.kind)}" aria-label="kind">'
        f'<datalist id="kinds">{kind_options}</datalist>'
        f'<input name="principal" placeholder="principal (subject, client or local name)" size="36" '
        f'value="{esc(filters.principal)}" aria-label="principal"><button>Filter</button>'
        + (f'<a href="{esc(base)}/">clear</a>' if filters.query() else "")
        + "</form>"
    )
    paging = ""
    if not first_page:
        paging += f'<a href="{esc(base)}/?{esc(urlencode(filters.query()))}">Newest</a> '
    if next_cursor is not None:
        paging += f'<a id="older" href="{esc(base)}/?{esc(urlencode({**filters.query(), "after": next_cursor}))}">Older →</a>'
    table = (
        "<table><thead><tr><th>Job</th><th>Kind</th><th>Principal</th><th>Status</th><th>Progress</th>"
        "<th>Age</th><th>Node</th><th>Attempts</th></tr></thead>"
        f'<tbody id="rows" data-feed="{esc(feed)}">{"".join(_row(r) for r in rows)}</tbody></table>'
        f'<p id="empty" class="muted"{" hidden" if rows else ""}>No jobs match.</p>'
    )
    body = (
        f'<h1>Jobs <span id="live" class="muted" style="font-size:12px;font-weight:400">live</span></h1>'
        f'{form}{table}<p>{paging}</p><script src="{esc(base)}/live.js" defer></script>'
    )
    return page("Jobs", body, base=base, operator=operator)


def _when(value: datetime | None) -> str:
    return "-" if value is None else value.strftime("%Y-%m-%d %H:%M:%S UTC")


def _json(value: Any) -> str:
    return f'<pre class="mono">{esc(json.dumps(value, indent=2, default=str, ensure_ascii=False))}</pre>'


def _options(values: list[Any]) -> str:
    return "".join(f'<option value="{esc(v)}">{esc(v)}</option>' for v in values)


def _field(key: str, name: str, prop: dict[str, Any], required: bool) -> str:
    """One form control for a question's field, from its schema (the answer is checked again server-side)."""
    ident = f"q-{key}-{name}"
    title = prop.get("title") or name
    label = f'<label for="{esc(ident)}">{esc(title)}{" *" if required else ""}</label>'
    hint = f'<div class="muted">{esc(prop["description"])}</div>' if prop.get("description") else ""
    attrs = f'id="{esc(ident)}" name="{esc(name)}"' + (" required" if required else "")
    kind = prop.get("type", "string")
    choices: list[Any] | None = None
    if isinstance(prop.get("enum"), list):
        choices = list(prop["enum"])
    elif isinstance(prop.get("oneOf"), list):
        choices = [o.get("const") for o in prop["oneOf"] if isinstance(o, dict)]
    if kind == "array":
        items = prop.get("items", {})
        options = items.get("enum") or [o.get("const") for o in items.get("anyOf", []) if isinstance(o, dict)]
        control = f"<select {attrs} multiple>{_options(options)}</select>"
    elif kind == "boolean":
        control = (
            f'<select {attrs}><option value="">choose…</option><option value="true">yes (true)</option>'
            '<option value="false">no (false)</option></select>'
        )
    elif choices is not None:
        control = f'<select {attrs}><option value="">choose…</option>{_options(choices)}</select>'
    elif kind in ("integer", "number"):
        step = "1" if kind == "integer" else "any"
        control = f'<input type="number" step="{step}" {attrs}>'
    else:
        secret = prop.get("writeOnly")
        control = f'<input type="{"password" if secret else "text"}" {attrs} autocomplete="off">'
    return label + hint + control


def _question(
    job: JobRecord,
    request: InputRequestRecord,
    *,
    reveal: bool,
    base: str,
    operator: Operator,
    problem: tuple[str, str] | None,
) -> str:
    head = (
        f'<div class="card question" data-key="{esc(request.key)}"><div><strong class="mono">{esc(request.key)}</strong> '
        f'<span class="muted">asked {_when(request.created_at)}</span></div>'
        f'<p class="message">{esc(request.message)}</p>'
    )
    if request.answered_at is not None:
        answer = (
            _json(sensitive_shown(request.answer))
            if reveal
            else '<span class="muted">answer hidden (reveal to show; sensitive fields stay hidden)</span>'
        )
        return (
            head
            + f"<p>Answered {_when(request.answered_at)} by <strong>{esc(request.answered_by or '-')}</strong></p>"
            f"{answer}</div>"
        )
    if problem is not None and problem[0] == request.key:
        head += f'<p class="error">{esc(problem[1])}</p>'
    if job.status != Status.INPUT_REQUIRED:
        return head + "</div>"
    schema = request.requested_schema
    required = set(schema.get("required", ()))
    fields = "".join(
        _field(request.key, name, prop, name in required)
        for name, prop in schema.get("properties", {}).items()
    )
    return (
        f'{head}<form method="post" action="{esc(base)}/jobs/{esc(job.id)}/answer/{esc(request.key)}">'
        f'{csrf_field(operator)}{fields}<p><button class="primary">Send answer</button></p></form></div>'
    )


def _step(step: StepRecord) -> str:
    ended = f", finished {_when(step.finished_at)}" if step.finished_at else ", outcome not recorded yet"
    error = f'<div class="error">{esc(step.error)}</div>' if step.error else ""
    return (
        f'<li class="step-{esc(step.status)}"><strong>{esc(step.name)}</strong> <span class="badge">{esc(step.status)}</span> '
        f'<span class="muted">attempt {step.attempt}, started {_when(step.started_at)}{ended}</span>{error}</li>'
    )


def _contact_facts(contact: NodeContact | None) -> list[tuple[str, str]]:
    """The job page's lines on its node's lease: when last heard from, and by when another node takes over."""
    if contact is None:
        return []
    heard = _heard(contact_text(contact), contact.quiet, "span")
    return [
        ("Node last heard", f"{_when(contact.last_heard_at)} {heard}"),
        ("Taken over by", f"{_when(contact.takeover_by)} at the latest, unless its node is heard from first"),
    ]


def job_page(
    job: JobRecord,
    questions: list[InputRequestRecord],
    steps: list[StepRecord],
    *,
    now: datetime,
    timing: LeaseTiming,
    reveal: bool,
    base: str,
    operator: Operator,
    problem: tuple[str, str] | None = None,
    notice: str | None = None,
) -> str:
    progress = _bar(fraction(job), job.progress_done)
    if job.progress_total and job.progress_done is not None:
        progress += f' <span class="muted">{esc(f"{job.progress_done:g} of {job.progress_total:g}")}</span>'
    retention = f"kept until {_when(job.expires_at)}"
    if job.keep_result_seconds is not None:
        retention += f" ({job.keep_result_seconds:g} s after it ends)"
    facts = [
        ("Job", f'<span class="mono">{esc(job.id)}</span>'),
        ("Kind", esc(job.kind)),
        ("Principal", esc(readable(job.principal))),
        ("Status", f"{_badge(job.status)} {esc(job.status_message or '')}"),
        ("Progress", progress),
        ("Created", f"{_when(job.created_at)} ({_age((now - job.created_at).total_seconds())} ago)"),
        ("Started", _when(job.started_at)),
        ("Finished", _when(job.finished_at)),
        ("Attempts", f"{job.attempts} of at most {job.max_attempts} (on interrupt: {esc(job.on_interrupt)})"),
        ("Running on", esc(job.lease_owner or "-")),
        *_contact_facts(node_contact(job.status, job.lease_expires_at, now, timing)),
        ("Retention", retention),
    ]
    if job.cancel_requested_at is not None:
        by = f"<strong>{esc(job.cancel_requested_by or '-')}</strong>"
        facts.append(("Cancel requested", f"{_when(job.cancel_requested_at)} by {by}"))
    if job.error:
        error = f'<span class="error">{esc(job.error.get("message") or job.error.get("error") or "")}</span>'
        if reference := job.error.get("reference"):
            error += f' <span class="mono">reference {esc(reference)}</span> (find it in the server log)'
        facts.append(("Error", error))
    rows = "".join(f"<tr><th>{name}</th><td>{cell}</td></tr>" for name, cell in facts)
    actions = ""
    if not Status(job.status).is_terminal:
        actions = f'<p><a class="danger" style="text-decoration:none" href="{esc(base)}/jobs/{esc(job.id)}/cancel">Cancel this job…</a></p>'
    timeline = "".join(_step(s) for s in steps) or '<li class="muted">No durable steps recorded.</li>'
    runs = (
        "".join(
            f'<tr><td>{c.attempt}</td><td class="mono">{esc(c.node)}</td><td>{_when(c.claimed_at)}</td>'
            f"<td>{'resumed' if c.resumed else 'new attempt'}</td></tr>"
            for c in claims_of(job)
        )
        or '<tr><td colspan="4" class="muted">Not claimed by any node yet.</td></tr>'
    )
    asked = (
        "".join(
            _question(job, q, reveal=reveal, base=base, operator=operator, problem=problem) for q in questions
        )
        or '<p class="muted">No questions asked.</p>'
    )
    if reveal:
        data = (
            "<h2>Arguments</h2>"
            + _json(sensitive_shown(job.arguments))
            + "<h2>Result</h2>"
            + (_json(job.result) if job.result is not None else '<p class="muted">No result.</p>')
            + f'<p><a href="{esc(base)}/jobs/{esc(job.id)}">Hide arguments, result and answers</a></p>'
        )
    else:
        data = (
            '<h2>Arguments and result</h2><p class="muted">Hidden. '
            f'<a id="reveal" href="{esc(base)}/jobs/{esc(job.id)}?reveal=1">Reveal arguments, result and answers</a> '
            "(sensitive values stay hidden).</p>"
        )
    flash = f'<p class="card">{esc(notice)}</p>' if notice else ""
    body = (
        f"<h1>{esc(job.kind)} {_badge(job.status)}</h1>{flash}"
        f'<table class="facts">{rows}</table>{actions}'
        f"<h2>Questions</h2>{asked}"
        f'<h2>Steps</h2><ol class="timeline">{timeline}</ol>'
        "<h2>Attempts</h2><table><thead><tr><th>Attempt</th><th>Node</th><th>Claimed</th><th></th></tr></thead>"
        f"<tbody>{runs}</tbody></table>{data}"
    )
    return page(f"{job.kind} {job.id[:12]}", body, base=base, operator=operator)


def cancel_confirm(job: JobRecord, *, base: str, operator: Operator) -> str:
    body = (
        f'<div class="card"><h1>Cancel {esc(job.kind)} <span class="mono">{esc(job.id)}</span>?</h1>'
        f"<p>Status: {esc(job.status)}. {esc(job.status_message or '')}</p>"
        f"<p>A queued job ends at once; a running one stops at its next safe point. "
        f"This is recorded as {esc(operator.recorded_as)}.</p>"
        f'<form method="post" action="{esc(base)}/jobs/{esc(job.id)}/cancel">{csrf_field(operator)}'
        '<input type="hidden" name="confirm" value="yes">'
        f'<button class="danger">Yes, cancel it</button> <a href="{esc(base)}/jobs/{esc(job.id)}">No, keep it running</a>'
        "</form></div>"
    )
    return page("Cancel?", body, base=base, operator=operator)


def overview(summary: Overview, *, now: datetime, base: str, operator: Operator) -> str:
    head = "".join(f"<th>{esc(s)}</th>" for s in STATES)
    kinds = (
        "".join(
            f'<tr><td><a href="{esc(base)}/?{esc(urlencode({"kind": kind}))}">{esc(kind)}</a></td>'
            + "".join(f'<td class="num">{counts[s]}</td>' for s in STATES)
            + "</tr>"
            for kind, counts in sorted(summary.by_kind.items())
        )
        or f'<tr><td colspan="{len(STATES) + 1}" class="muted">No unfinished or recently failed job.</td></tr>'
    )
    nodes = (
        "".join(
            f'<tr><td class="mono">{esc(node)}</td><td class="num">{count}</td></tr>'
            for node, count in sorted(summary.by_node.items())
        )
        or '<tr><td colspan="2" class="muted">No job is running.</td></tr>'
    )
    oldest = (
        "No job is queued."
        if summary.oldest_queued is None
        else f"The oldest queued job has waited {_age((now - summary.oldest_queued).total_seconds())}."
    )
    body = (
        f'<h1>Overview</h1><p id="oldest">{oldest}</p><h2>Per job kind</h2>'
        f'<table id="kinds"><thead><tr><th>Kind</th>{head}</tr></thead><tbody>{kinds}</tbody></table>'
        '<h2>Running per node</h2><table id="nodes"><thead><tr><th>Node</th><th>Running</th></tr></thead>'
        f"<tbody>{nodes}</tbody></table>"
    )
    return page("Overview", body, base=base, operator=operator)
