// Static twin of a d2lmini explorer: controls that move without a Python kernel.
// The page embeds every pre-computed frame as JSON next to this script; moving a
// control picks the frame for the new combination and redraws its panels as SVG.
// No library and nothing from the network. Written for d2lmini (MIT licence).
(function () {
  "use strict";
  var SVG = "http://www.w3.org/2000/svg";

  function el(name, attrs, parent) {
    var node = document.createElementNS(SVG, name);
    for (var key in attrs) node.setAttribute(key, attrs[key]);
    if (parent) parent.appendChild(node);
    return node;
  }

  function text(parent, x, y, content, attrs) {
    var node = el("text", Object.assign({ x: x, y: y, "font-size": 12, fill: "#222",
      "font-family": "DejaVu Sans, Helvetica, Arial, sans-serif" }, attrs || {}), parent);
    node.textContent = content;
    return node;
  }

  function niceTicks(lo, hi, count) {
    var span = hi - lo || 1, step = Math.pow(10, Math.floor(Math.log10(span / count)));
    var err = (count * step) / span;
    if (err <= 0.15) step *= 10; else if (err <= 0.35) step *= 5; else if (err <= 0.75) step *= 2;
    var ticks = [];
    for (var t = Math.ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) ticks.push(+t.toPrecision(12));
    return ticks;
  }

  function formatTick(value, log) {
    if (log) {
      var e = Math.round(Math.log10(value));
      return e === 0 ? "1" : "1e" + e;
    }
    return Math.abs(value) >= 1000 ? value.toExponential(0) : String(+value.toPrecision(4));
  }

  function drawPanel(svg, panel, series, box) {
    var log = !!panel.log, ys = [];
    series.forEach(function (s) { s.y.forEach(function (v) { if (v !== null && (!log || v > 0)) ys.push(v); }); });
    var lo = panel.ymin !== undefined ? panel.ymin : Math.min.apply(null, ys);
    var hi = panel.ymax !== undefined ? panel.ymax : Math.max.apply(null, ys);
    if (log) { lo = Math.pow(10, Math.floor(Math.log10(lo))); hi = Math.pow(10, Math.ceil(Math.log10(hi))); }
    else { hi = hi + 0.08 * (hi - lo || 1); if (panel.ymin === undefined) lo = Math.min(lo, 0); }
    var f = log ? Math.log10 : function (v) { return v; };
    var x0 = box.x + 52, x1 = box.x + box.w - 8, y0 = box.y + box.h - 34, y1 = box.y + 22;
    var sx = function (v) { return x0 + (v - panel.xmin) / (panel.xmax - panel.xmin) * (x1 - x0); };
    var sy = function (v) { return y0 - (f(v) - f(lo)) / (f(hi) - f(lo)) * (y0 - y1); };
    text(svg, (x0 + x1) / 2, box.y + 14, panel.title, { "text-anchor": "middle", "font-size": 13 });
    var yticks = log ? [] : niceTicks(lo, hi, 5);
    if (log) {
      var step = Math.max(1, Math.ceil((Math.log10(hi) - Math.log10(lo)) / 6));
      for (var e = Math.log10(lo); e <= Math.log10(hi) + 1e-9; e += step) yticks.push(Math.pow(10, e));
    }
    yticks.forEach(function (t) {
      el("line", { x1: x0, x2: x1, y1: sy(t), y2: sy(t), stroke: "#e4e4e4" }, svg);
      text(svg, x0 - 5, sy(t) + 4, formatTick(t, log), { "text-anchor": "end", "font-size": 11 });
    });
    niceTicks(panel.xmin, panel.xmax, 4).forEach(function (t) {
      el("line", { x1: sx(t), x2: sx(t), y1: y0, y2: y0 + 4, stroke: "#444" }, svg);
      text(svg, sx(t), y0 + 16, formatTick(t, false), { "text-anchor": "middle", "font-size": 11 });
    });
    el("polyline", { points: [x0, y1, x0, y0, x1, y0].join(","), fill: "none", stroke: "#444" }, svg);
    text(svg, (x0 + x1) / 2, y0 + 30, panel.xlabel, { "text-anchor": "middle" });
    text(svg, box.x + 12, (y0 + y1) / 2, panel.ylabel,
         { "text-anchor": "middle", transform: "rotate(-90 " + (box.x + 12) + " " + (y0 + y1) / 2 + ")" });
    var clip = "clip" + Math.random().toString(36).slice(2);
    el("rect", { x: x0, y: y1, width: x1 - x0, height: y0 - y1 }, el("clipPath", { id: clip }, svg));
    series.forEach(function (s) {
      var points = [];
      s.y.forEach(function (v, i) {
        var x = s.x0 + i * (s.dx || 1);
        if (v !== null && (!log || v > 0)) points.push(sx(x).toFixed(1) + "," + sy(v).toFixed(1));
      });
      el("polyline", { points: points.join(" "), fill: "none", stroke: s.color, "stroke-width": 2,
                       "stroke-dasharray": s.dash ? "6,4" : "none", "clip-path": "url(#" + clip + ")" }, svg);
    });
    var labelled = series.filter(function (s) { return s.label; });
    var longest = Math.max.apply(null, labelled.map(function (s) { return s.label.length; }).concat([0]));
    labelled.forEach(function (s, i) {  // the legend's width follows its longest label (about 6.5 px a character)
      var ly = y0 - 10 - 15 * (labelled.length - 1 - i), lx = x1 - Math.max(48, 26 + 6.5 * longest);
      el("line", { x1: lx, x2: lx + 16, y1: ly, y2: ly, stroke: s.color, "stroke-width": 2,
                   "stroke-dasharray": s.dash ? "4,3" : "none" }, svg);
      text(svg, lx + 20, ly + 4, s.label, { "font-size": 11 });
    });
  }

  function render(root, spec) {
    var key = spec.controls.map(function (c) { return root.querySelector("[data-control='" + c.name + "']"); })
      .map(function (input, i) {
        var c = spec.controls[i];
        return c.type === "range" ? String(c.values[+input.value]) : input.value;
      }).join("|");
    spec.controls.forEach(function (c) {
      if (c.type !== "range") return;
      var input = root.querySelector("[data-control='" + c.name + "']");
      root.querySelector("[data-readout='" + c.name + "']").textContent = String(c.values[+input.value]);
    });
    var frame = spec.frames[key];
    var svg = root.querySelector("svg");
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    el("rect", { x: 0, y: 0, width: spec.width, height: spec.height, fill: "white" }, svg);
    if (!frame) { text(svg, 20, 40, "no pre-computed frame for " + key); return; }
    var w = spec.width / spec.panels.length;
    spec.panels.forEach(function (panel, i) {
      drawPanel(svg, panel, frame.panels[i], { x: i * w, y: 22, w: w, h: spec.height - 22 });
    });
    text(svg, spec.width / 2, 16, frame.title, { "text-anchor": "middle", "font-size": 13 });
    root.setAttribute("data-frame", key);
  }

  function init(root) {
    if (root.getAttribute("data-ready")) return;
    root.setAttribute("data-ready", "1");
    var spec = JSON.parse(root.querySelector("script[type='application/json']").textContent);
    var panel = root.querySelector(".d2l-twin-controls");
    spec.controls.forEach(function (c) {
      var label = document.createElement("label");
      label.textContent = c.label + " ";
      label.style.marginRight = "1.2em";
      var input;
      if (c.type === "range") {
        input = document.createElement("input");
        input.type = "range"; input.min = 0; input.max = c.values.length - 1; input.step = 1;
        input.value = Math.max(0, c.values.indexOf(c.value));
        var readout = document.createElement("span");
        readout.setAttribute("data-readout", c.name);
        readout.style.display = "inline-block"; readout.style.minWidth = "2.5em";
        label.appendChild(input); label.appendChild(readout);
      } else {
        input = document.createElement("select");
        c.options.forEach(function (o) {
          var option = document.createElement("option");
          option.value = o[0]; option.textContent = o[1];
          input.appendChild(option);
        });
        input.value = c.value;
        label.appendChild(input);
      }
      input.setAttribute("data-control", c.name);
      input.addEventListener("input", function () { render(root, spec); });
      input.addEventListener("change", function () { render(root, spec); });
      panel.appendChild(label);
    });
    var svg = el("svg", { viewBox: "0 0 " + spec.width + " " + spec.height, width: "100%",
                          role: "img", "aria-label": spec.description || "explorer" });
    svg.style.maxWidth = spec.width + "px";
    svg.style.background = "white";
    root.appendChild(svg);
    render(root, spec);
  }

  document.querySelectorAll(".d2l-twin").forEach(init);
})();
