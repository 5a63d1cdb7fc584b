// Says why an htmx request failed. htmx swaps nothing for an error status,
// so without this a refused or failed click looks like a button that does
// nothing. The error pages mark their reason with [data-reason].
(function () {
  "use strict";
  function reason(xhr) {
    var body = xhr.responseText || "";
    if (body.indexOf("<") !== -1) {
      var marked = new DOMParser()
        .parseFromString(body, "text/html")
        .querySelector("[data-reason]");
      return marked ? marked.textContent.trim() : "";
    }
    return body.length <= 300 ? body.trim() : "";
  }
  function box() {
    return document.getElementById("request-error");
  }
  function show(text) {
    var el = box();
    if (!el) return;
    el.querySelector("[data-text]").textContent = text;
    el.hidden = false;
  }
  document.addEventListener("htmx:responseError", function (event) {
    var xhr = event.detail.xhr;
    var why = reason(xhr);
    show(
      "Not done: the server answered " + xhr.status + " " + xhr.statusText +
        (why ? ": " + why : ".")
    );
  });
  document.addEventListener("htmx:sendError", function () {
    show("Not done: the server could not be reached. Try again in a moment.");
  });
  document.addEventListener("htmx:beforeRequest", function () {
    var el = box();
    if (el) el.hidden = true;
  });
  document.addEventListener("click", function (event) {
    if (event.target.closest("[data-dismiss]")) box().hidden = true;
  });
})();
