// The accuracy planner: as ε moves, ask /planner.json for the ± and show it. Without JavaScript
// the form's Plan button does the same with a page load.
(function () {
  "use strict";
  var form = document.getElementById("planner");
  if (!form) { return; }
  var slider = document.getElementById("p-epsilon");
  var pending = null;
  function show(id, text) { document.getElementById(id).textContent = text; }
  function update() {
    show("p-epsilon-shown", slider.value);
    var query = new URLSearchParams(new FormData(form)).toString();
    if (pending) { pending.abort(); }
    pending = new AbortController();
    fetch("/planner.json?" + query, { signal: pending.signal, credentials: "same-origin" })
      .then(function (r) { return r.json(); })
      .then(function (e) {
        show("p-error", e.error_text || "—");
        show("p-sql", e.sql || "");
        show("p-cost-epsilon", e.cost_epsilon === null || e.cost_epsilon === undefined ? "—" : String(+e.cost_epsilon.toPrecision(6)));
        show("p-cost-delta", e.cost_delta === null || e.cost_delta === undefined ? "—" : String(e.cost_delta));
        show("p-note", e.note || "");
        var problem = document.getElementById("p-problem");
        problem.textContent = e.problem || "";
        problem.hidden = !e.problem;
        history.replaceState(null, "", "/planner?" + query);
      })
      .catch(function () { /* a newer request replaced it */ });
  }
  slider.addEventListener("input", update);
  document.getElementById("p-aggregate").addEventListener("change", update);
  document.getElementById("p-column").addEventListener("change", update);
  document.getElementById("p-rows").addEventListener("change", update);
  // Another table has other columns: reload the form for it.
  document.getElementById("p-table").addEventListener("change", function () {
    document.getElementById("p-column").value = "*";
    form.submit();
  });
}());
