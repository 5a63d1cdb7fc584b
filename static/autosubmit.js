// Submits a filter form when one of its [data-autosubmit] controls changes;
// the Content-Security-Policy forbids inline onchange handlers.
(function () {
  "use strict";
  document.addEventListener("change", function (event) {
    var control = event.target.closest("[data-autosubmit]");
    if (control && control.form) control.form.requestSubmit();
  });
})();
