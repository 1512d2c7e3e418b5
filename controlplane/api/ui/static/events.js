// The live event feed: polls /ui/events.json for events after the newest one shown and puts them
// on top. Text goes in with textContent only (event data comes from users), never as markup.
"use strict";
(function () {
  const table = document.getElementById("feed");
  if (!table) return;
  const body = table.tBodies[0];
  const status = document.getElementById("feed-status");
  let last = Number(table.dataset.last || "0");
  const MAX_ROWS = 300;

  function when(iso) {
    const d = new Date(iso);
    return isNaN(d) ? iso : d.toISOString().replace("T", " ").slice(0, 19) + " UTC";
  }

  function cell(row, text) {
    const td = row.insertCell();
    td.textContent = text;
    return td;
  }

  function add(event, before) {
    const row = document.createElement("tr");
    row.className = "new";
    cell(row, when(event.at)).className = "when";
    cell(row, event.type);
    const link = cell(row, "");
    if (event.workload_id) {
      const a = document.createElement("a");
      a.href = "/ui/workloads/" + encodeURIComponent(event.workload_id);
      a.textContent = event.workload;
      link.appendChild(a);
    }
    cell(row, event.team);
    cell(row, event.summary);
    body.insertBefore(row, before);
  }

  async function poll() {
    try {
      const answer = await fetch("/ui/events.json?after=" + last, { credentials: "same-origin" });
      if (answer.status === 401) {
        window.location.assign("/ui/login");
        return;
      }
      if (!answer.ok) throw new Error("HTTP " + answer.status);
      const events = await answer.json();
      if (events.length) {
        const empty = body.querySelector("tr.empty");
        if (empty) empty.remove();
        const first = body.firstChild;
        // newest first in the answer: keep that order above the rows already shown
        for (const event of events) add(event, first);
        last = Math.max(last, ...events.map((e) => e.seq));
        while (body.rows.length > MAX_ROWS) body.deleteRow(-1);
      }
      status.textContent = "Live, updated " + new Date().toLocaleTimeString();
    } catch (error) {
      status.textContent = "Feed paused (" + error.message + "), retrying";
    }
    window.setTimeout(poll, 3000);
  }

  window.setTimeout(poll, 1000);
})();
