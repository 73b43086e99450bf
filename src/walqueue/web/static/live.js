// walqueue-web's only script: refreshes the overview's figures and plot in place.
// Every element with data-live="NAME" gets the text of NAME in /overview.json (textContent:
// never parsed as HTML); the plot is fetched again. Nothing else on any page depends on it.
"use strict";
(function () {
  const REFRESH_MS = 5000;
  const live = document.querySelectorAll("[data-live]");
  if (live.length === 0) return;
  const plot = document.getElementById("plot");
  let stale = false;
  async function refresh() {
    try {
      const answer = await fetch("/overview.json", {cache: "no-store", credentials: "same-origin"});
      if (!answer.ok) throw new Error(answer.status + " " + answer.statusText);
      const figures = await answer.json();
      for (const element of live) {
        const name = element.dataset.live;
        if (Object.prototype.hasOwnProperty.call(figures, name)) element.textContent = figures[name];
      }
      if (plot) plot.src = "/plot.svg?at=" + Date.now();
      if (stale) { document.body.classList.remove("stale"); stale = false; }
    } catch (error) {
      document.body.classList.add("stale");  // the figures shown are not current
      stale = true;
    }
  }
  setInterval(refresh, REFRESH_MS);
})();
