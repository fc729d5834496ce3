"""The console's pages: each is a layout with named, empty regions that `static/app.js` fills
from the REST API and refreshes every few seconds."""

from __future__ import annotations

from dataclasses import dataclass
from html import escape


@dataclass(frozen=True, slots=True)
class Page:
    key: str
    path: str
    title: str
    body: str


_FLEET = """
<section class="cards" id="fleet-cards" aria-live="polite"></section>
<h2>Spokes</h2>
<table id="spokes" class="data">
  <thead><tr><th>Spoke</th><th>Region</th><th>Kind</th><th>Status</th><th>Nodes</th>
  <th>GPUs free / total</th><th>Running</th><th>Last report</th></tr></thead>
  <tbody></tbody>
</table>
"""

_QUEUE = """
<p class="hint">Pending work in the order the next scheduling cycle looks at it, and why each
job waits.</p>
<table id="queue" class="data">
  <thead><tr><th>#</th><th>Job</th><th>Name</th><th>Team</th><th>Class</th><th>Priority</th>
  <th>GPUs</th><th>Waiting</th><th>Reason</th><th>Why</th></tr></thead>
  <tbody></tbody>
</table>
"""

_JOBS = """
<details id="submit-box" open>
  <summary>Submit a job</summary>
  <form id="submit-form" class="form">
    <label>Name <input name="name" required pattern="[a-z0-9]([-a-z0-9]*[a-z0-9])?"
      value="notebook"></label>
    <label>Team <input name="team" required value=""></label>
    <label>Priority <select name="priority_class">
      <option>batch</option><option>dev</option><option>training</option>
      <option>production</option></select></label>
    <label>GPUs per node <input name="gpus_per_node" type="number" min="1" max="64"
      value="1"></label>
    <label>Nodes <input name="nodes" type="number" min="1" value="1"></label>
    <label>GPU model <input name="gpu_model" placeholder="any"></label>
    <label class="wide">Command <input name="command" required value="sleep 60"
      title="run by /bin/sh -c"></label>
    <button type="submit">Submit</button>
    <output id="submit-result" role="status"></output>
  </form>
</details>
<div class="toolbar">
  <label>Team <input id="jobs-team" placeholder="all"></label>
  <label><input type="checkbox" id="jobs-active"> active only</label>
</div>
<table id="jobs" class="data">
  <thead><tr><th>Job</th><th>Name</th><th>Team</th><th>GPUs</th><th>Phase</th><th>Spoke</th>
  <th>Wait</th><th>Run</th><th>Why</th><th></th></tr></thead>
  <tbody></tbody>
</table>
<section id="job-detail" hidden>
  <h2 id="job-title"></h2>
  <div class="split">
    <div><h3>Events</h3><ol id="job-events" class="events"></ol></div>
    <div><h3>Log <small id="job-log-state"></small></h3><pre id="job-log"></pre></div>
  </div>
</section>
"""

_TEAMS = """
<p class="hint">Guaranteed GPUs per team against what its work holds now; borrowed GPUs are
use beyond the guarantee, which preemption may reclaim. Cost is what the team's burst
instances have been billed.</p>
<table id="teams" class="data">
  <thead><tr><th>Team</th><th>Guaranteed</th><th>Using</th><th>Borrowing</th>
  <th>By model (using / guaranteed / limit)</th><th>Queued</th><th>Weight</th>
  <th>Cloud cost</th></tr></thead>
  <tbody></tbody>
</table>
"""

_BURST = """
<section class="cards" id="burst-cards"></section>
<h2>Instances</h2>
<table id="instances" class="data">
  <thead><tr><th>Instance</th><th>Type</th><th>Market</th><th>Team</th><th>State</th>
  <th>$/h</th><th>Boot</th><th>Busy</th><th>Idle</th><th>Billed</th></tr></thead>
  <tbody></tbody>
</table>
"""

_USAGE = """
<div class="toolbar">
  <label>Window <select id="usage-window">
    <option value="900">15 minutes</option><option value="3600" selected>1 hour</option>
    <option value="86400">1 day</option><option value="604800">7 days</option>
  </select></label>
</div>
<h2>GPUs in use by team</h2>
<div id="chart-gpus" class="chart" role="img" aria-label="GPUs in use over time"></div>
<h2>Cloud cost by team ($ per interval)</h2>
<div id="chart-cost" class="chart" role="img" aria-label="Cloud cost over time"></div>
<h2>Totals in the window</h2>
<table id="usage" class="data">
  <thead><tr><th>Team</th><th>GPU-hours on-prem</th><th>GPU-hours cloud</th><th>Runs</th>
  <th>Cloud cost</th></tr></thead>
  <tbody></tbody>
  <tfoot></tfoot>
</table>
"""

PAGES = (
    Page("fleet", "/", "Fleet", _FLEET),
    Page("queue", "/queue", "Queue", _QUEUE),
    Page("jobs", "/jobs", "My jobs", _JOBS),
    Page("teams", "/teams", "Teams", _TEAMS),
    Page("burst", "/burst", "Burst", _BURST),
    Page("usage", "/usage", "Usage", _USAGE),
)
_BY_KEY = {p.key: p for p in PAGES}


def render(key: str) -> str:
    """The whole HTML document of page `key`."""
    page = _BY_KEY[key]
    nav = "".join(
        f'<a href="{p.path}"{" aria-current=page" if p.key == key else ""}>{escape(p.title)}</a>'
        for p in PAGES
    )
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{escape(page.title)} - gpufed</title>
<link rel="stylesheet" href="/console/static/app.css">
<script src="/console/static/app.js" defer></script>
</head>
<body data-page="{page.key}">
<header>
  <strong class="brand">gpufed</strong>
  <nav>{nav}</nav>
  <form id="token-form" class="token">
    <label>API token <input id="token" type="password" autocomplete="off"
      placeholder="Bearer token"></label>
    <button type="submit">Save</button>
    <span id="token-state" role="status"></span>
  </form>
</header>
<main>
<h1>{escape(page.title)}</h1>
<p id="error" class="error" role="alert" hidden></p>
{page.body}
<p class="updated">Updated <span id="updated">never</span></p>
</main>
</body>
</html>
"""
