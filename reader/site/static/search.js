// Optional: the site reads fine without it. Filters the static index (search-index.js) by every word typed.
(function () {
  "use strict";
  var entries = window.FSDP_SEARCH || [];
  var root = document.querySelector('link[rel="stylesheet"]').getAttribute("href").replace("assets/site.css", "");
  var input = document.getElementById("q");
  var list = document.getElementById("results");
  if (!input || !list) { return; }
  function show(query) {
    var words = query.toLowerCase().split(/\s+/).filter(Boolean);
    list.textContent = "";
    list.hidden = words.length === 0;
    if (!words.length) { return; }
    var found = entries.filter(function (e) {
      var text = e.t.toLowerCase();
      return words.every(function (w) { return text.indexOf(w) >= 0; });
    }).slice(0, 60);
    if (!found.length) {
      var none = document.createElement("li");
      none.textContent = "nothing mentions every word";
      list.appendChild(none);
    }
    found.forEach(function (e) {
      var item = document.createElement("li");
      var kind = document.createElement("span");
      kind.className = "kind";
      kind.textContent = e.k + " · " + e.g;
      var link = document.createElement("a");
      link.href = root + e.h;
      link.textContent = e.t.length > 140 ? e.t.slice(0, 140) + "…" : e.t;
      item.appendChild(kind);
      item.appendChild(link);
      list.appendChild(item);
    });
  }
  input.form.addEventListener("submit", function (event) { event.preventDefault(); show(input.value); });
  input.addEventListener("input", function () { show(input.value); });
  var asked = new URLSearchParams(window.location.search).get("q");
  if (asked) { input.value = asked; show(asked); }
}());
