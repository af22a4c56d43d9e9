// The web page's only script: confirmations, actions without a reload, live tokens, live refresh.
// Text from the server is only ever set with textContent, or as HTML the server rendered and escaped.
(function () {
  "use strict";
  var jobBox = document.getElementById("job");
  var rows = document.getElementById("job-rows");
  var buffer = { turn: null, attempt: null, text: "" };
  var source = null;
  var pending = null;
  var LOGS_PAGE = 100, EVENTS_PAGE = 100;  // pipelines.web.job_page's pages

  function finished() {
    var s = document.getElementById("job-status");
    return !!s && s.getAttribute("data-finished") === "yes";
  }

  function showTyping() {
    var box = document.getElementById("typing");
    var text = document.getElementById("typing-text");
    if (!box || !text) { return; }
    text.textContent = buffer.text;
    // A reply waiting for approval is rendered by the server, labelled so: the streamed copy is not shown twice.
    // The text of an attempt whose worker was lost is dropped: that attempt never commits, the turn runs again.
    var status = document.getElementById("job-status");
    var lost = !!status && status.getAttribute("data-place") === "worker lost";
    if (lost) { buffer.text = ""; }
    box.hidden = !buffer.text || !!document.getElementById("pending-reply");
  }

  function flash(message) {
    var f = document.getElementById("flash");
    if (!f) { window.alert(message); return; }
    f.textContent = message;
    f.hidden = !message;
  }

  // A committed event patches the page: the parts that change are swapped, and only the messages committed
  // after those shown are appended (a long conversation is never sent again). A transcript cut back reloads.
  function swap(doc, id) {
    var fresh = doc.getElementById(id);
    var old = document.getElementById(id);
    if (fresh && old) { old.replaceWith(document.adoptNode(fresh)); }
  }

  // The page's messages can no longer be patched (the transcript was cut back, or grew by more than a page):
  // it reloads, unless the person is typing in one of its forms, whose text a reload would lose. Then the
  // live refresh stops and a banner says to reload.
  var stale = false;
  function reloadUnlessDrafting() {
    var fields = document.querySelectorAll("textarea, input[type=text], input:not([type])");
    for (var i = 0; i < fields.length; i++) {
      if (fields[i].value !== fields[i].defaultValue) {
        stale = true;
        flash("This conversation moved on since the page was loaded: reload the page to see it " +
              "(copy what you typed first).");
        return;
      }
    }
    window.location.reload();
  }

  // One refresh at a time: two in flight would ask from the same point and both add what is new (an action's
  // refresh, a committed event's and the 5 s look can meet). A refresh asked for meanwhile runs after it.
  var inFlight = false, again = false;
  function refresh() {
    if (stale) { return; }
    if (inFlight) { again = true; return; }
    inFlight = true;
    var done = function () {
      inFlight = false;
      if (again) { again = false; refresh(); }
    };
    var box = document.getElementById("messages");
    var q = new URLSearchParams(window.location.search);
    q.delete("upto");
    if (box && box.getAttribute("data-follow") === "yes") {
      q.set("from", box.getAttribute("data-len") || "0");
      q.set("tail", box.getAttribute("data-tail") || "");
      q.set("first", box.getAttribute("data-first") || "0");
    }
    var logLines = document.getElementById("log-lines");
    if (logLines && logLines.getAttribute("data-follow") === "yes") {
      q.set("logs_seen", logLines.getAttribute("data-total") || "0");
    }
    var eventList = document.getElementById("event-list");
    if (eventList && eventList.getAttribute("data-follow") === "yes") {
      q.set("events_seen", eventList.getAttribute("data-newest") || "");
    }
    fetch(jobBox.getAttribute("data-live-url") + "?" + q.toString(),
          { credentials: "same-origin", headers: { accept: "text/html" } })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) {
        if (html === null) { return; }
        var doc = new DOMParser().parseFromString(html, "text/html");
        var added = doc.getElementById("live-messages");
        if (added && added.getAttribute("data-reset") === "yes") { again = false; reloadUnlessDrafting(); return; }
        swap(doc, "job-top");
        swap(doc, "transcript-tail");
        swap(doc, "job-bottom");
        if (added && box && box.getAttribute("data-follow") === "yes") {
          var none = document.getElementById("no-messages");
          if (none && added.firstElementChild) { none.remove(); }
          while (added.firstElementChild) {
            var m = document.adoptNode(added.firstElementChild);
            if (!m.id || !document.getElementById(m.id)) { box.appendChild(m); }
          }
          box.setAttribute("data-len", added.getAttribute("data-len") || box.getAttribute("data-len"));
          box.setAttribute("data-tail", added.getAttribute("data-tail") || box.getAttribute("data-tail"));
          var count = document.getElementById("transcript-count");
          var n = parseInt(box.getAttribute("data-len") || "0", 10);
          if (count) { count.textContent = n + (n === 1 ? " message" : " messages"); }
        }
        prepend(doc.getElementById("live-logs"), logLines, LOGS_PAGE);
        if (logLines && doc.getElementById("live-logs")) {
          logLines.setAttribute("data-total", doc.getElementById("live-logs").getAttribute("data-total") || "0");
          var logCount = document.getElementById("log-count");
          if (logCount) { logCount.textContent = logLines.getAttribute("data-total"); }
          var empty = document.getElementById("log-empty");
          if (empty && logLines.firstElementChild) { empty.remove(); }
        }
        prepend(doc.getElementById("live-events"), eventList, EVENTS_PAGE);
        if (eventList && eventList.firstElementChild) {
          eventList.setAttribute("data-newest", eventList.firstElementChild.getAttribute("data-event") || "");
        }
        showTyping();
        if (finished()) { stopStream(); } else { startStream(); }
      })
      .catch(function () { /* a failed look is retried by the next event or the 5 s look */ })
      .then(done);
  }

  // New lines and events come newest first: they go on top, and the list keeps one page.
  function prepend(fresh, list, keep) {
    if (!fresh || !list) { return; }
    var items = Array.prototype.slice.call(fresh.children);
    var shown = {};
    Array.prototype.forEach.call(list.children, function (li) { shown[li.getAttribute("data-event") || ""] = true; });
    for (var i = items.length - 1; i >= 0; i--) {
      var key = items[i].getAttribute("data-event");
      if (key && shown[key]) { continue; }  // an event already shown is never shown twice
      list.insertBefore(document.adoptNode(items[i]), list.firstChild);
    }
    while (list.children.length > keep) { list.removeChild(list.lastElementChild); }
  }

  function soon() {
    if (pending) { return; }
    pending = window.setTimeout(function () { pending = null; refresh(); }, 150);
  }

  function onPart(ev) {
    var p;
    try { p = JSON.parse(ev.data); } catch (e) { return; }
    var attempt = String((p.data || {}).attempt);
    if (p.type === "attempt_started") {
      buffer = { turn: p.turn, attempt: attempt, text: "" };
      showTyping();
    } else if (p.type === "text_delta") {
      if (p.turn === buffer.turn && attempt === buffer.attempt) {
        buffer.text += String((p.data || {}).text || "");
        showTyping();
      }
    } else {
      if (p.type === "turn_committed" && p.turn === buffer.turn) { buffer.text = ""; }
      soon();  // a committed event: the server renders the page's new state
    }
  }

  function startStream() {
    if (source || !window.EventSource) { return; }
    source = new EventSource(jobBox.getAttribute("data-stream-url"));
    source.onmessage = onPart;
  }

  function stopStream() {
    if (source) { source.close(); source = null; }
  }

  function errorText(html) {
    var doc = new DOMParser().parseFromString(html, "text/html");
    var e = doc.getElementById("error");
    return e ? e.textContent : "the action failed";
  }

  function submitAction(form) {
    var body = new URLSearchParams(new FormData(form));
    fetch(form.action, { method: "POST", body: body, credentials: "same-origin" })
      .then(function (r) {
        if (r.ok) { flash(""); return null; }
        return r.text().then(function (t) { flash(errorText(t)); });
      })
      .then(refresh);
  }

  document.addEventListener("submit", function (ev) {
    var form = ev.target;
    if (!(form instanceof HTMLFormElement)) { return; }
    var question = form.getAttribute("data-confirm");
    if (question && !window.confirm(question)) { ev.preventDefault(); return; }
    if (jobBox && form.classList.contains("action")) {
      ev.preventDefault();
      submitAction(form);
    }
  });

  // The rows shown are refreshed by id, in the order shown: a job that changes is updated where it is (rows
  // never jump under the cursor); how many others changed since the page loaded is said above the table.
  function refreshRows() {
    var table = document.getElementById("jobs");
    var now = document.getElementById("job-rows");
    if (!table || !now) { return; }
    var ids = [];
    now.querySelectorAll("tr[data-job]").forEach(function (tr) { ids.push(tr.getAttribute("data-job")); });
    var q = new URLSearchParams(window.location.search);
    q.delete("before"); q.delete("back"); q.delete("page");
    q.set("partial", "1");
    q.set("ids", ids.join(","));
    q.set("loaded", table.getAttribute("data-loaded") || "");
    fetch(window.location.pathname + "?" + q.toString(), { credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) {
        var current = document.getElementById("job-rows");
        if (html === null || !current) { return; }
        // The ticks of a bulk action survive the refresh: the rows are the same ones, read again.
        var ticked = {};
        current.querySelectorAll("input[name=id]:checked").forEach(function (box) { ticked[box.value] = true; });
        if (ids.length) { current.outerHTML = html; }
        document.querySelectorAll("#job-rows input[name=id]").forEach(function (box) {
          if (ticked[box.value]) { box.checked = true; }
        });
        var fresh = document.getElementById("job-rows");
        var n = parseInt((fresh && fresh.getAttribute("data-newer")) || "0", 10) || 0;
        var newer = document.getElementById("newer");
        var count = document.getElementById("newer-n");
        if (newer && count) {
          count.textContent = String(n);
          newer.setAttribute("href", window.location.pathname + window.location.search);
          newer.hidden = n === 0;
        }
      });
  }

  if (jobBox && !finished()) { startStream(); }
  // A worker that dies sends nothing: while the job runs, the page looks again every 5 s (the look sends no
  // message already shown), so a lost worker is said within seconds of its lease running out.
  // A finished job is looked at too, every 30 s: another operator may run it again.
  var looks = 0;
  if (jobBox) { window.setInterval(function () { looks += 1; if (!document.hidden && (!finished() || looks % 6 === 0)) { refresh(); } }, 5000); }
  if (rows) { window.setInterval(refreshRows, 3000); }
}());
