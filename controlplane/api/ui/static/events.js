// The live event feed: polls /ui/events.json for events after the newest one shown and puts them
// on top. Text goes in with textContent only (event data comes from users), never as markup.
"use strict";
(function () {
  const table = document.getElementById("feed");
  if (!table) return;
  const body = table.tBodies[0];
  const status = document.getElementById("feed-status");
  let last = Number(table.dataset.last || "0");
  // The page's filters: the feed polls with the same ones.
  const filters = new URLSearchParams();
  if (table.dataset.family) filters.set("family", table.dataset.family);
  if (table.dataset.workload) filters.set("workload", table.dataset.workload);
  const MAX_ROWS = 300;

  function exact(iso) {
    const d = new Date(iso);
    return isNaN(d) ? iso : d.toISOString().replace("T", " ").slice(0, 19) + " UTC";
  }

  // As the server renders it: "just now" or "3 min ago", the exact time on hover.
  function when(td, iso) {
    const t = document.createElement("time");
    t.dateTime = iso;
    t.title = exact(iso);
    const seconds = Math.max(0, Math.round((Date.now() - new Date(iso)) / 1000));
    t.textContent = seconds < 5 ? "just now" : seconds < 60 ? seconds + " s ago" : Math.floor(seconds / 60) + " min ago";
    td.appendChild(t);
  }

  function cell(row, text) {
    const td = row.insertCell();
    td.textContent = text;
    return td;
  }

  function add(event, before) {
    const row = document.createElement("tr");
    row.className = "new";
    const at = cell(row, "");
    at.className = "when";
    when(at, event.at);
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
      const answer = await fetch("/ui/events.json?after=" + last + (filters.toString() ? "&" + filters.toString() : ""), {
        credentials: "same-origin",
      });
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
