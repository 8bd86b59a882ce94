// Live panels: the server sends `refresh` when the outbox's channel is notified (and every few
// seconds); the panels are then fetched again, server-rendered, and swapped in.
(function () {
  "use strict";
  var live = document.getElementById("live");
  var panels = document.getElementById("panels");
  var loading = false;

  function refresh() {
    if (loading) { return; }
    loading = true;
    var down = false;
    fetch(panels.dataset.panels, { credentials: "same-origin", cache: "no-store" })
      .then(function (response) {
        // 503: the database cannot be read; the answer is the banner that says so.
        down = response.status === 503;
        if (!response.ok && !down) { throw new Error("HTTP " + response.status); }
        return response.text();
      })
      .then(function (html) {
        panels.innerHTML = html;
        live.textContent = down ? "database unreachable" : "live";
        live.className = down ? "live off" : "live on";
      })
      .catch(function () {
        live.textContent = "offline";
        live.className = "live off";
      })
      .finally(function () { loading = false; });
  }

  if (!window.EventSource) { return; }
  var source = new EventSource(panels.dataset.events, { withCredentials: true });
  source.addEventListener("refresh", refresh);
  source.onerror = function () {
    live.textContent = "reconnecting…";
    live.className = "live off";
  };
})();
