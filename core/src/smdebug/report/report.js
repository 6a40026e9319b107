// smdebug report: draws the curves (inline SVG) and heatmaps (canvas) from the page's own JSON data.
// Hover shows values; drag across a chart zooms into those steps; double-click (or "reset") zooms out.
(function () {
  "use strict";
  var errorBox = document.getElementById("smdebug-errors");
  function report(message) {
    document.documentElement.setAttribute("data-render", "error");
    errorBox.hidden = false;
    errorBox.textContent += message + "\n";
  }
  window.addEventListener("error", function (e) { report("script error: " + e.message); });

  var D = JSON.parse(document.getElementById("smdebug-data").textContent);
  var tip = document.getElementById("smdebug-tip");
  var PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2"];

  function esc(s) {
    return String(s).replace(/[&<>"]/g, function (c) {
      return { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" }[c];
    });
  }
  function fmt(v) {
    if (typeof v !== "number") return String(v);
    if (v === 0) return "0";
    var a = Math.abs(v);
    return a >= 1e4 || a < 1e-3 ? v.toExponential(3) : String(+v.toPrecision(4));
  }
  function showTip(evt, html) {
    tip.innerHTML = html;
    tip.hidden = false;
    var x = evt.clientX + 14, y = evt.clientY + 14;
    if (x + tip.offsetWidth > window.innerWidth) x = evt.clientX - tip.offsetWidth - 14;
    tip.style.left = x + "px";
    tip.style.top = y + "px";
  }
  function hideTip() { tip.hidden = true; }
  function ticks(lo, hi, n) {
    if (!(hi > lo)) return [lo];
    var step = Math.pow(10, Math.floor(Math.log10((hi - lo) / n)));
    var err = (hi - lo) / n / step;
    step *= err >= 7.5 ? 10 : err >= 3.5 ? 5 : err >= 1.5 ? 2 : 1;
    var out = [];
    for (var t = Math.ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) out.push(+t.toPrecision(12));
    return out;
  }
  // drag to zoom on the x axis of an element; calls zoom(fraction0, fraction1) and reset()
  function zoomable(el, band, zoom, reset) {
    var start = null;
    el.addEventListener("mousedown", function (e) {
      var r = el.getBoundingClientRect();
      start = (e.clientX - r.left) / r.width;
      e.preventDefault();
    });
    window.addEventListener("mousemove", function (e) {
      if (start === null) return;
      var r = el.getBoundingClientRect();
      var now = Math.min(1, Math.max(0, (e.clientX - r.left) / r.width));
      band.hidden = false;
      band.style.left = Math.min(start, now) * 100 + "%";
      band.style.width = Math.abs(now - start) * 100 + "%";
    });
    window.addEventListener("mouseup", function (e) {
      if (start === null) return;
      var r = el.getBoundingClientRect();
      var end = Math.min(1, Math.max(0, (e.clientX - r.left) / r.width));
      band.hidden = true;
      var a = Math.min(start, end), b = Math.max(start, end);
      start = null;
      if (b - a > 0.01) zoom(a, b);
    });
    el.addEventListener("dblclick", reset);
  }

  // -- line charts ---------------------------------------------------------------------------------------
  function lineChart(box, curve) {
    var W = 640, H = 260, L = 58, R = 12, T = 12, B = 30;
    var xs = [], series = curve.series;
    series.forEach(function (s) { xs = xs.concat(s.x); });
    var full = [Math.min.apply(null, xs), Math.max.apply(null, xs)];
    if (full[0] === full[1]) { full = [full[0] - 1, full[1] + 1]; }
    var dom = full.slice(), logY = false;
    var controls = document.createElement("div");
    controls.className = "controls";
    controls.innerHTML = '<label><input type="checkbox"> log scale</label> <button type="button">reset zoom</button>';
    var plot = document.createElement("div");
    plot.className = "plot";
    var band = document.createElement("div");
    band.className = "band";
    band.hidden = true;
    box.appendChild(controls);
    box.appendChild(plot);
    var legend = document.createElement("div");
    legend.className = "legend";
    legend.innerHTML = series.map(function (s, i) {
      return '<span><i style="background:' + PALETTE[i % PALETTE.length] + '"></i>' + esc(s.name) + "</span>";
    }).join("") + (curve.marks.length ? '<span><i class="mark"></i>' + esc(markKinds(curve.marks)) + "</span>" : "");
    box.appendChild(legend);
    controls.querySelector("input").addEventListener("change", function (e) { logY = e.target.checked; draw(); });
    controls.querySelector("button").addEventListener("click", function () { dom = full.slice(); draw(); });

    function yOf(v) { return logY ? (v > 0 ? Math.log10(v) : null) : v; }
    function draw() {
      var ys = [];
      series.forEach(function (s) {
        s.x.forEach(function (x, i) {
          var y = typeof s.y[i] === "number" ? yOf(s.y[i]) : null;
          if (x >= dom[0] && x <= dom[1] && y !== null) ys.push(y);
        });
      });
      var y0 = ys.length ? Math.min.apply(null, ys) : 0, y1 = ys.length ? Math.max.apply(null, ys) : 1;
      if (y1 === y0) { y0 -= 0.5; y1 += 0.5; }
      var pad = (y1 - y0) * 0.05; y0 -= pad; y1 += pad;
      function px(x) { return L + (x - dom[0]) / (dom[1] - dom[0]) * (W - L - R); }
      function py(y) { return T + (1 - (y - y0) / (y1 - y0)) * (H - T - B); }
      var svg = ['<svg viewBox="0 0 ' + W + " " + H + '" preserveAspectRatio="none" role="img" aria-label="' + esc(curve.name) + '">'];
      svg.push('<rect class="frame" x="' + L + '" y="' + T + '" width="' + (W - L - R) + '" height="' + (H - T - B) + '"/>');
      ticks(y0, y1, 5).forEach(function (t) {
        var label = logY ? fmt(Math.pow(10, t)) : fmt(t);
        svg.push('<line class="grid" x1="' + L + '" x2="' + (W - R) + '" y1="' + py(t) + '" y2="' + py(t) + '"/>');
        svg.push('<text class="tick" x="' + (L - 4) + '" y="' + (py(t) + 4) + '" text-anchor="end">' + label + "</text>");
      });
      ticks(dom[0], dom[1], 6).forEach(function (t) {
        if (t !== Math.round(t)) return;
        svg.push('<text class="tick" x="' + px(t) + '" y="' + (H - B + 16) + '" text-anchor="middle">' + t + "</text>");
      });
      svg.push('<text class="tick" x="' + (W - R) + '" y="' + (H - 2) + '" text-anchor="end">step</text>');
      curve.marks.forEach(function (m) {
        if (m.step < dom[0] || m.step > dom[1]) return;
        svg.push('<line class="mark" x1="' + px(m.step) + '" x2="' + px(m.step) + '" y1="' + T + '" y2="' + (H - B) + '"><title>' + esc(m.label + " at step " + m.step) + "</title></line>");
      });
      series.forEach(function (s, k) {
        var pts = [], color = PALETTE[k % PALETTE.length];
        s.x.forEach(function (x, i) {
          var y = typeof s.y[i] === "number" ? yOf(s.y[i]) : null;
          if (x < dom[0] || x > dom[1]) return;
          if (y === null) {
            if (typeof s.y[i] === "string") svg.push('<text class="nonfinite" x="' + px(x) + '" y="' + (T + 10) + '" text-anchor="middle">' + esc(s.y[i]) + "</text>");
            return;
          }
          pts.push(px(x).toFixed(1) + "," + py(y).toFixed(1));
        });
        svg.push('<polyline class="series" stroke="' + color + '" points="' + pts.join(" ") + '"/>');
        if (pts.length <= 60) pts.forEach(function (p) {
          var c = p.split(",");
          svg.push('<circle cx="' + c[0] + '" cy="' + c[1] + '" r="2.5" fill="' + color + '"/>');
        });
      });
      svg.push('<line class="cursor" x1="0" x2="0" y1="' + T + '" y2="' + (H - B) + '" visibility="hidden"/>');
      svg.push("</svg>");
      plot.innerHTML = svg.join("");
      plot.appendChild(band);
      var cursor = plot.querySelector(".cursor");
      plot.onmousemove = function (e) {
        var r = plot.getBoundingClientRect();
        var sx = (e.clientX - r.left) / r.width * W;
        if (sx < L || sx > W - R) { hideTip(); cursor.setAttribute("visibility", "hidden"); return; }
        var step = dom[0] + (sx - L) / (W - L - R) * (dom[1] - dom[0]);
        var rows = [], best = null;
        series.forEach(function (s, k) {
          var j = nearest(s.x, step);
          if (j < 0) return;
          if (best === null || Math.abs(s.x[j] - step) < Math.abs(best - step)) best = s.x[j];
          rows.push('<i style="background:' + PALETTE[k % PALETTE.length] + '"></i>' + esc(s.name) + " step " + s.x[j] + ": <b>" + fmt(s.y[j]) + "</b>");
        });
        curve.marks.forEach(function (m) {
          if (Math.abs(px(m.step) - sx) < 4) rows.push('<span class="fired">' + esc(m.label) + " at step " + m.step + "</span>");
        });
        if (best !== null) {
          cursor.setAttribute("x1", px(best)); cursor.setAttribute("x2", px(best));
          cursor.setAttribute("visibility", "visible");
        }
        showTip(e, "<b>" + esc(curve.name) + "</b><br>" + rows.join("<br>"));
      };
      plot.onmouseleave = function () { hideTip(); cursor.setAttribute("visibility", "hidden"); };
    }
    zoomable(plot, band, function (a, b) {
      var fa = (a * W - L) / (W - L - R), fb = (b * W - L) / (W - L - R), span = dom[1] - dom[0];
      dom = [dom[0] + Math.max(0, fa) * span, dom[0] + Math.min(1, fb) * span];
      draw();
    }, function () { dom = full.slice(); draw(); });
    draw();
  }
  function markKinds(marks) {
    var kinds = [];
    marks.forEach(function (m) {
      var kind = m.label.indexOf("non-finite") >= 0 ? "first non-finite value" : "rule fired";
      if (kinds.indexOf(kind) < 0) kinds.push(kind);
    });
    return kinds.join(" / ");
  }
  function nearest(xs, x) {
    var lo = 0, hi = xs.length - 1;
    if (hi < 0) return -1;
    while (hi - lo > 1) { var mid = (lo + hi) >> 1; if (xs[mid] < x) lo = mid; else hi = mid; }
    return Math.abs(xs[lo] - x) <= Math.abs(xs[hi] - x) ? lo : hi;
  }

  // -- heatmaps -----------------------------------------------------------------------------------------
  var CODE_MAX = 65533, NON_FINITE = 65534, MISSING = 65535;
  var STOPS = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]]; // viridis
  function colour(f) {
    var x = Math.min(1, Math.max(0, f)) * (STOPS.length - 1), i = Math.min(STOPS.length - 2, Math.floor(x)), t = x - i;
    return STOPS[i].map(function (c, k) { return Math.round(c + (STOPS[i + 1][k] - c) * t); });
  }
  function heatmap(box, hm) {
    var raw = atob(hm.codes), n = raw.length / 2, codes = new Uint16Array(n);
    for (var i = 0; i < n; i++) codes[i] = raw.charCodeAt(2 * i) | (raw.charCodeAt(2 * i + 1) << 8);
    var rows = hm.rows.length, cols = hm.steps.length;
    function value(code) {
      if (code === MISSING) return hm.missing || "not saved";
      if (code === NON_FINITE) return "NaN/Inf";
      if (code === 0) return hm.scale === "log" ? "0" : hm.lo;
      var s = hm.lo + (code - 1) / (CODE_MAX - 1) * (hm.hi - hm.lo);
      return hm.scale === "log" ? Math.pow(10, s) : s;
    }
    var image = document.createElement("canvas");
    image.width = cols; image.height = rows;
    var ctx = image.getContext("2d"), pixels = ctx.createImageData(cols, rows);
    for (var k = 0; k < n; k++) {
      var code = codes[k], rgb;
      if (code === MISSING) rgb = [235, 235, 235];
      else if (code === NON_FINITE) rgb = [230, 0, 0];
      else if (code === 0) rgb = [20, 20, 20];
      else rgb = colour((code - 1) / (CODE_MAX - 1));
      pixels.data.set([rgb[0], rgb[1], rgb[2], 255], 4 * k);
    }
    ctx.putImageData(pixels, 0, 0);

    var rowH = Math.max(2, Math.min(18, Math.floor(720 / rows)));
    var every = Math.ceil(12 / rowH);  // a label every 12 px at least: rows can be 2 px high
    box.innerHTML = '<div class="controls"><button type="button">reset zoom</button> <span class="scale"></span></div>' +
      '<div class="hm"><div class="labels"></div><div class="cells"><canvas></canvas><div class="band" hidden></div><div class="axis"></div></div></div>';
    var labels = box.querySelector(".labels"), cells = box.querySelector(".cells"), canvas = box.querySelector("canvas");
    labels.innerHTML = hm.rows.map(function (name, r) {
      return '<div class="layer" style="height:' + rowH + 'px" title="' + esc(name) + '">' + (r % every === 0 ? "<span>" + esc(name) + "</span>" : "") + "</div>";
    }).join("");
    var lo = hm.scale === "log" ? fmt(Math.pow(10, hm.lo)) : fmt(hm.lo), hi = hm.scale === "log" ? fmt(Math.pow(10, hm.hi)) : fmt(hm.hi);
    box.querySelector(".scale").innerHTML = hm.scale + " scale " + lo + ' <span class="ramp"></span> ' + hi +
      ' &nbsp;<i class="swatch" style="background:#e60000"></i>NaN/Inf' + (hm.non_finite ? " (" + hm.non_finite + ")" : "") +
      ' <i class="swatch" style="background:#ebebeb"></i>' + esc(hm.missing || "not saved") + (hm.scale === "log" ? ' <i class="swatch" style="background:#141414"></i>0' : "");
    var c0 = 0, c1 = cols;
    function draw() {
      var width = Math.max(200, cells.clientWidth || 600), height = rows * rowH;
      canvas.width = width; canvas.height = height;
      canvas.style.height = height + "px";
      var g = canvas.getContext("2d");
      g.imageSmoothingEnabled = false;
      g.drawImage(image, c0, 0, c1 - c0, rows, 0, 0, width, height);
      var axis = box.querySelector(".axis"), marks = [];
      var count = Math.min(c1 - c0, 8);
      for (var t = 0; t < count; t++) {
        var c = c0 + Math.floor((t + 0.5) * (c1 - c0) / count);
        marks.push('<span style="left:' + ((c - c0 + 0.5) / (c1 - c0) * 100) + '%">' + hm.steps[c] + "</span>");
      }
      axis.innerHTML = marks.join("") + '<span class="unit">step</span>';
    }
    canvas.addEventListener("mousemove", function (e) {
      var r = canvas.getBoundingClientRect();
      var c = c0 + Math.floor((e.clientX - r.left) / r.width * (c1 - c0)), row = Math.floor((e.clientY - r.top) / r.height * rows);
      if (c < c0 || c >= c1 || row < 0 || row >= rows) { hideTip(); return; }
      showTip(e, "<b>" + esc(hm.rows[row]) + "</b><br>step " + hm.steps[c] + ": <b>" + fmt(value(codes[row * cols + c])) + "</b>");
    });
    canvas.addEventListener("mouseleave", hideTip);
    zoomable(cells, box.querySelector(".band"), function (a, b) {
      var span = c1 - c0, n0 = c0 + Math.floor(a * span), n1 = c0 + Math.ceil(b * span);
      if (n1 - n0 >= 1) { c0 = n0; c1 = n1; draw(); }
    }, function () { c0 = 0; c1 = cols; draw(); });
    box.querySelector("button").addEventListener("click", function () { c0 = 0; c1 = cols; draw(); });
    window.addEventListener("resize", draw);
    draw();
  }

  function run(id, fn, arg) {
    var box = document.getElementById(id);
    if (!box) return;
    try { fn(box, arg); } catch (e) { report(id + ": " + (e && e.stack || e)); }
  }
  (D.curves || []).forEach(function (curve, i) { run("curve-" + i, lineChart, curve); });
  if (D.gradients) run("heatmap-gradients", heatmap, D.gradients);
  if (D.update_ratio) run("heatmap-update-ratio", heatmap, D.update_ratio);

  if (D.reload_seconds) {  // --watch: reload to show the run's new steps, keeping the scroll position
    var key = "smdebug-scroll:" + location.pathname;
    var saved = sessionStorage.getItem(key);
    if (saved) window.scrollTo(0, +saved);
    setTimeout(function () { sessionStorage.setItem(key, String(window.scrollY)); location.reload(); }, D.reload_seconds * 1000);
  }
  if (document.documentElement.getAttribute("data-render") !== "error") document.documentElement.setAttribute("data-render", "ok");
})();
