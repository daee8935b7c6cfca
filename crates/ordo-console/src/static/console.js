// Live refresh of the overview's numbers: every few seconds, the same
// values the page was rendered with, read from overview.json, replace the
// text of each element carrying a data-metric attribute. The page works
// without it; only the numbers' freshness depends on it.
"use strict";
(function () {
  var metrics = document.querySelectorAll("[data-metric]");
  if (metrics.length === 0) {
    return;
  }
  function refresh() {
    fetch("/overview.json", { credentials: "same-origin", cache: "no-store" })
      .then(function (response) {
        return response.ok ? response.json() : null;
      })
      .then(function (values) {
        if (!values) {
          return;
        }
        metrics.forEach(function (element) {
          var value = values[element.getAttribute("data-metric")];
          if (typeof value === "string") {
            element.textContent = value;
          }
        });
      })
      .catch(function () {
        // The next tick tries again.
      });
  }
  window.setInterval(refresh, 5000);
})();
