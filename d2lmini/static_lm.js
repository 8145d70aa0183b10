// The model in the page: a d2lmini LanguageModel (the chapter "The 2026 block") run in JavaScript.
// The page embeds each model's configuration and float16 weights as JSON beside this script
// (d2lmini.webmodel.ModelTwin writes them); this file decodes them and computes what
// d2lmini/lm.py computes: embedding, positions (learned, the 2017 paper's sinusoids, or RoPE in
// attention), the blocks (norm, attention with GQA and QK-norm, SwiGLU or the 2017 block's ReLU
// FFN), the key/value cache, final norm and head; then generate() exactly as d2lmini.generate
// decodes, sliding window included. Arithmetic is float64 (PyTorch computes in float32 from the
// same float16 weights, so logits agree to about 1e-5).
// No library and nothing from the network. Written for d2lmini (MIT licence).
(function () {
  "use strict";
  var lib = (window.d2lmini = window.d2lmini || {});

  if (!lib.LanguageModel) {
    // ------------------------------------------------------------------ weights

    // One IEEE half-precision number (its 16 bits) as a float.
    function halfToFloat(bits) {
      var sign = bits & 0x8000 ? -1 : 1, exponent = (bits >> 10) & 0x1f, fraction = bits & 0x3ff;
      if (exponent === 0) return sign * fraction * Math.pow(2, -24);  // subnormal
      if (exponent === 31) return fraction ? NaN : sign * Infinity;
      return sign * (1 + fraction / 1024) * Math.pow(2, exponent - 15);
    }

    // The base64 text of little-endian float16 numbers as a Float32Array (every half is a float32 exactly).
    function decodeFloat16(base64) {
      var bytes = atob(base64), out = new Float32Array(bytes.length / 2);
      for (var i = 0; i < out.length; i++) {
        out[i] = halfToFloat(bytes.charCodeAt(2 * i) | (bytes.charCodeAt(2 * i + 1) << 8));
      }
      return out;
    }

    // ------------------------------------------------------------------ the parts of a block

    // y = W x + b for an nn.Linear stored as (out, in), row-major, for each x of xs (the new positions):
    // each row of W is read once for all of them. Every y[o] sums bias, then W[o, i] x[i] in order of i.
    function linear(layer, xs) {
      var W = layer.weight, n = layer.in, m = xs.length, ys = [], o, t, i;
      for (t = 0; t < m; t++) ys.push(new Float64Array(layer.out));
      for (o = 0; o < layer.out; o++) {
        var row = o * n, start = layer.bias ? layer.bias[o] : 0;
        for (t = 0; t + 1 < m; t += 2) {  // two positions at a time: each weight loaded once for both
          var x0 = xs[t], x1 = xs[t + 1], sum0 = start, sum1 = start;
          for (i = 0; i < n; i++) { var w = W[row + i]; sum0 += w * x0[i]; sum1 += w * x1[i]; }
          ys[t][o] = sum0; ys[t + 1][o] = sum1;
        }
        if (t < m) {
          var x = xs[t], sum = start;
          for (i = 0; i < n; i++) sum += W[row + i] * x[i];
          ys[t][o] = sum;
        }
      }
      return ys;
    }

    // RMSNorm (norms.py): x / sqrt(mean(x^2) + eps) * weight, over x[from .. from + size).
    function rmsNorm(x, weight, eps, from, size) {
      from = from || 0; size = size || weight.length;
      var square = 0;
      for (var i = 0; i < size; i++) square += x[from + i] * x[from + i];
      var scale = 1 / Math.sqrt(square / size + eps);
      for (i = 0; i < size; i++) x[from + i] = x[from + i] * scale * weight[i];
      return x;
    }

    // torch.nn.LayerNorm: (x - mean) / sqrt(var + eps) * weight + bias, the variance biased.
    function layerNorm(x, weight, bias, eps) {
      var n = x.length, mean = 0, variance = 0, i;
      for (i = 0; i < n; i++) mean += x[i];
      mean /= n;
      for (i = 0; i < n; i++) variance += (x[i] - mean) * (x[i] - mean);
      var scale = 1 / Math.sqrt(variance / n + eps), y = new Float64Array(n);
      for (i = 0; i < n; i++) y[i] = (x[i] - mean) * scale * weight[i] + bias[i];
      return y;
    }

    function norm(model, layer, x) {
      if (model.config.norm === "rms") return rmsNorm(Float64Array.from(x), layer.weight, layer.eps);
      return layerNorm(x, layer.weight, layer.bias, layer.eps);
    }

    // RoPE's cosines and sines at one position, half-split layout (attention.py's rotary_cos_sin):
    // pair j turns by position * theta^(-2j / head_dim); angles in float32, as PyTorch computes them.
    function rotary(model, position) {
      var c = model.config, half = c.head_dim / 2, cos = new Float64Array(half), sin = new Float64Array(half);
      for (var j = 0; j < half; j++) {
        var inverse = Math.fround(1 / Math.fround(Math.pow(c.rope_theta, Math.fround(2 * j / c.head_dim))));
        var angle = Math.fround(position * inverse);
        cos[j] = Math.fround(Math.cos(angle)); sin[j] = Math.fround(Math.sin(angle));
      }
      return { cos: cos, sin: sin };
    }

    // The 2017 paper's positions (lm.py's sinusoidal_positions), a Float32Array of numSteps rows of d:
    // P[p, 2i] = sin(p / 10000^(2i/d)) and P[p, 2i+1] = cos(p / 10000^(2i/d)), each step rounded to
    // float32 as PyTorch computes it. Math.sin and Math.cos rounded to float32 are the correctly
    // rounded values; PyTorch's float32 sin and cos differ from them by one unit in the last place
    // (6e-8) in about one entry in twenty, far less than float64 and float32 arithmetic differ by.
    function sinusoidalPositions(numSteps, d) {
      var P = new Float32Array(numSteps * d);  // storing a number in it rounds it to float32
      for (var i = 0; i < d; i += 2) {  // i is the formula's 2i: the even column
        var denominator = Math.fround(Math.pow(10000, Math.fround(i / d)));
        for (var p = 0; p < numSteps; p++) {
          var angle = Math.fround(p / denominator);
          P[p * d + i] = Math.sin(angle);
          P[p * d + i + 1] = Math.cos(angle);
        }
      }
      return P;
    }

    // Rotate head features x[from .. from + head_dim): feature j pairs with j + head_dim / 2 (apply_rotary).
    function applyRotary(x, from, half, turn) {
      for (var j = 0; j < half; j++) {
        var a = x[from + j], b = x[from + j + half];
        x[from + j] = a * turn.cos[j] - b * turn.sin[j];
        x[from + j + half] = b * turn.cos[j] + a * turn.sin[j];
      }
    }

    // MultiHeadAttention for the new positions xs of a causal sequence (the first at `position`),
    // with its layer's cache: project, QK-norm each head, RoPE, append the keys and values to the
    // cache, attend (the softmax of scale * q.k over every position up to its own), concatenate the
    // heads, W_o. records (optional): per new position, a list receiving each head's weights.
    function attention(model, layer, xs, position, cache, records) {
      var c = model.config, d = c.head_dim, h = c.num_heads, hkv = c.num_kv_heads, head, t;
      var qs = linear(layer.W_q, xs), ks = linear(layer.W_k, xs), vs = linear(layer.W_v, xs), outs = [];
      for (t = 0; t < xs.length; t++) {
        var q = qs[t], k = ks[t];
        if (layer.q_norm) {  // 'per_head': one gain vector over each head's features, before RoPE
          for (head = 0; head < h; head++) rmsNorm(q, layer.q_norm.weight, c.qk_norm_eps, head * d, d);
          for (head = 0; head < hkv; head++) rmsNorm(k, layer.k_norm.weight, c.qk_norm_eps, head * d, d);
        }
        if (c.positions === "rope") {
          var turn = rotary(model, position + t);
          for (head = 0; head < h; head++) applyRotary(q, head * d, d / 2, turn);
          for (head = 0; head < hkv; head++) applyRotary(k, head * d, d / 2, turn);
        }
        cache.keys.push(k); cache.values.push(vs[t]);
      }
      var group = h / hkv, scale = 1 / Math.sqrt(d), before = cache.keys.length - xs.length;
      for (t = 0; t < xs.length; t++) {
        var n = before + t + 1, out = new Float64Array(h * d), query = qs[t];  // causal: positions 0 .. this one
        for (head = 0; head < h; head++) {
          var kv = Math.floor(head / group) * d, qh = head * d, weights = new Float64Array(n), largest = -Infinity,
              total = 0, j, i;
          for (j = 0; j < n; j++) {
            var dot = 0, key = cache.keys[j];
            for (i = 0; i < d; i++) dot += query[qh + i] * key[kv + i];
            weights[j] = dot * scale;
            if (weights[j] > largest) largest = weights[j];
          }
          for (j = 0; j < n; j++) { weights[j] = Math.exp(weights[j] - largest); total += weights[j]; }
          for (j = 0; j < n; j++) {
            weights[j] /= total;
            var value = cache.values[j], weight = weights[j];
            for (i = 0; i < d; i++) out[qh + i] += weight * value[kv + i];
          }
          if (records) records[t].push(weights);
        }
        outs.push(out);
      }
      return linear(layer.W_o, outs);
    }

    // FeedForward (ffn.py): W_2 relu(W_1 x) (the 2017 block) or W_2 (silu(W_g x) * W_1 x) (SwiGLU).
    function feedForward(model, layer, xs) {
      var hiddens = linear(layer.W_1, xs), gates = model.config.act === "swiglu" ? linear(layer.W_g, xs) : null;
      hiddens.forEach(function (hidden, t) {
        for (var i = 0; i < hidden.length; i++) {
          hidden[i] = gates ? hidden[i] * gates[t][i] / (1 + Math.exp(-gates[t][i])) : Math.max(hidden[i], 0);
        }
      });
      return linear(layer.W_2, hiddens);
    }

    function add(x, y) {
      var z = new Float64Array(x.length);
      for (var i = 0; i < x.length; i++) z[i] = x[i] + y[i];
      return z;
    }

    function addEach(xs, ys) { return xs.map(function (x, t) { return add(x, ys[t]); }); }
    function normEach(model, layer, xs) { return xs.map(function (x) { return norm(model, layer, x); }); }

    // TransformerBlock (block.py) at the new positions: post-LN x <- Norm(x + F(x)), pre-LN x <- x + F(Norm(x)).
    function transformerBlock(model, block, xs, position, cache, records) {
      if (model.config.placement === "post") {
        xs = normEach(model, block.addnorm1.norm_post, addEach(xs, attention(model, block.attention, xs, position, cache, records)));
        return normEach(model, block.addnorm2.norm_post, addEach(xs, feedForward(model, block.ffn, xs)));
      }
      xs = addEach(xs, attention(model, block.attention, normEach(model, block.addnorm1.norm_in, xs), position, cache, records));
      return addEach(xs, feedForward(model, block.ffn, normEach(model, block.addnorm2.norm_in, xs)));
    }

    // ------------------------------------------------------------------ the language model

    // A d2lmini LanguageModel from its exported spec {name, config, tensors: [[name, shape], ...], weights}.
    function LanguageModel(spec) {
      var c = (this.config = spec.config), values = decodeFloat16(spec.weights), offset = 0, named = {};
      this.name = spec.name;
      spec.tensors.forEach(function (entry) {
        var size = entry[1].reduce(function (a, b) { return a * b; }, 1);
        named[entry[0]] = { data: values.subarray(offset, offset + size), shape: entry[1] };
        offset += size;
      });
      function lin(prefix) {
        var w = named[prefix + ".weight"], b = named[prefix + ".bias"];
        return w && { weight: w.data, bias: b ? b.data : null, out: w.shape[0], in: w.shape[1] };
      }
      function normLayer(prefix, eps) {
        var w = named[prefix + ".weight"], b = named[prefix + ".bias"];
        return w && { weight: w.data, bias: b ? b.data : null, eps: eps };
      }
      this.embedding = named["embedding.weight"].data;
      this.pos_embedding = named.pos_embedding ? named.pos_embedding.data : null;  // learned: trained vectors
      this.pos_encoding = c.positions === "sinusoidal" ? sinusoidalPositions(c.context_len, c.num_hiddens) : null;
      this.blocks = [];
      for (var i = 0; i < c.num_blocks; i++) {
        var p = "blocks." + i + ".";
        this.blocks.push({
          attention: { W_q: lin(p + "attention.W_q"), W_k: lin(p + "attention.W_k"), W_v: lin(p + "attention.W_v"),
                       W_o: lin(p + "attention.W_o"), q_norm: normLayer(p + "attention.q_norm", c.qk_norm_eps),
                       k_norm: normLayer(p + "attention.k_norm", c.qk_norm_eps) },
          ffn: { W_1: lin(p + "ffn.W_1"), W_g: lin(p + "ffn.W_g"), W_2: lin(p + "ffn.W_2") },
          addnorm1: { norm_in: normLayer(p + "addnorm1.norm_in", c.norm_eps),
                      norm_post: normLayer(p + "addnorm1.norm_post", c.norm_eps) },
          addnorm2: { norm_in: normLayer(p + "addnorm2.norm_in", c.norm_eps),
                      norm_post: normLayer(p + "addnorm2.norm_post", c.norm_eps) } });
      }
      this.final_norm = normLayer("final_norm", c.norm_eps);
      this.head = lin("head");
    }

    // One empty LayerCache per block: the keys (after QK-norm and RoPE) and values of every position so far.
    function KVCache(model) {
      this.layers = model.blocks.map(function () { return { keys: [], values: [] }; });
    }
    KVCache.prototype.length = function () { return this.layers[0].keys.length; };

    // Next-token logits (vocab_size) after the ids `tokens`, the new positions after those in `cache`
    // (LanguageModel.forward with a cache, the last row). inside (optional) collects, per position,
    // each block's heads' attention weights and the stream after the embedding and after each block.
    LanguageModel.prototype.forward = function (tokens, cache, inside) {
      var c = this.config, d = c.num_hiddens, position = cache.length(), self = this;
      if (position + tokens.length > c.context_len) throw new Error("more than context_len positions");
      var xs = tokens.map(function (token, t) {
        var x = Float64Array.from(self.embedding.subarray(token * d, (token + 1) * d)), p = (position + t) * d;
        if (self.pos_embedding) x = add(x, self.pos_embedding.subarray(p, p + d));
        if (self.pos_encoding) x = add(x, self.pos_encoding.subarray(p, p + d));
        return x;
      });
      var steps = inside ? tokens.map(function (_, t) { return { streams: [xs[t]], attention: [] }; }) : null;
      for (var i = 0; i < this.blocks.length; i++) {
        var records = inside ? tokens.map(function () { return []; }) : null;
        xs = transformerBlock(this, this.blocks[i], xs, position, cache.layers[i], records);
        if (inside) steps.forEach(function (step, t) { step.streams.push(xs[t]); step.attention.push(records[t]); });
      }
      if (inside) steps.forEach(function (step) { inside.push(step); });
      var x = xs[xs.length - 1];
      if (this.final_norm) x = norm(this, this.final_norm, x);
      return linear(this.head, [x])[0];
    };

    // ------------------------------------------------------------------ decoding

    // mulberry32, a 32-bit generator (Tommy Ettinger's): the same seed gives the same draws in every
    // browser. Not torch's generator, so a seeded sample differs from d2lmini.generate's; greedy agrees.
    function seededRandom(seed) {
      var state = seed >>> 0;
      return function () {
        state = (state + 0x6d2b79f5) >>> 0;
        var z = state;
        z = Math.imul(z ^ (z >>> 15), z | 1);
        z ^= z + Math.imul(z ^ (z >>> 7), z | 61);
        return ((z ^ (z >>> 14)) >>> 0) / 4294967296;
      };
    }

    // next_token (lm.py): the argmax (first of equal ones, as torch.argmax), or a draw from
    // softmax(logits / temperature) over the top_k largest logits (ties with the k-th kept).
    function nextToken(logits, options, random) {
      var i, best = 0;
      if (!options.do_sample) {
        for (i = 1; i < logits.length; i++) if (logits[i] > logits[best]) best = i;
        return best;
      }
      var scaled = Array.prototype.map.call(logits, function (l) { return l / options.temperature; });
      var kth = options.top_k ? scaled.slice().sort(function (a, b) { return b - a; })[options.top_k - 1] : -Infinity;
      var largest = Math.max.apply(null, scaled), weights = scaled.map(function (l) {
        return l < kth ? 0 : Math.exp(l - largest);
      });
      var total = weights.reduce(function (a, b) { return a + b; }, 0), u = random() * total;
      for (i = 0; i < weights.length; i++) {
        u -= weights[i];
        if (u < 0 && weights[i] > 0) return i;
      }
      for (i = weights.length - 1; weights[i] === 0; i--) {}
      return i;  // rounding left u >= 0: the last token kept
    }

    // generate (lm.py) one token at a time: new Generator(model, ids, options).step() returns the next
    // id. Each step feeds the ids the cache has not seen; past context_len the window slides and is
    // recomputed from its start, as d2lmini.generate does. options: do_sample, temperature, top_k, seed.
    function Generator(model, ids, options) {
      this.model = model; this.ids = ids.slice(); this.fresh = ids.slice();
      this.options = options || {}; this.cache = new KVCache(model);
      this.random = seededRandom(this.options.seed || 0);
    }
    Generator.prototype.step = function () {
      var context = this.model.config.context_len;
      if (this.cache.length() + this.fresh.length > context) {  // the window slides: refill it
        this.cache = new KVCache(this.model); this.fresh = this.ids.slice(-context);
      }
      var token = nextToken(this.model.forward(this.fresh, this.cache), this.options, this.random);
      this.ids.push(token); this.fresh = [token];
      return token;
    };

    function generate(model, ids, maxNewTokens, options) {
      var g = new Generator(model, ids, options);
      for (var i = 0; i < maxNewTokens; i++) g.step();
      return g.ids;
    }

    // Inside the model for the last context_len ids: attention[block][head] is the matrix of weights
    // (row p: how position p attends to 0 .. p), rms[0] the stream's root mean square after the
    // embedding (and positions) and rms[i] after block i, over every position and feature.
    function inside(model, ids) {
      var last = ids.slice(-model.config.context_len), steps = [];
      model.forward(last, new KVCache(model), steps);
      var attention = model.blocks.map(function (_, b) {
        return steps[0].attention[b].map(function (_, head) {
          return steps.map(function (s) { return Array.from(s.attention[b][head]); });
        });
      });
      var rms = steps[0].streams.map(function (_, i) {
        var square = 0, count = 0;
        steps.forEach(function (s) { s.streams[i].forEach(function (v) { square += v * v; count++; }); });
        return Math.sqrt(square / count);
      });
      return { tokens: last, attention: attention, rms: rms };
    }

    lib.LanguageModel = LanguageModel;
    lib.KVCache = KVCache;
    lib.Generator = Generator;
    lib.generate = generate;
    lib.nextToken = nextToken;
    lib.seededRandom = seededRandom;
    lib.inside = inside;
    lib.decodeFloat16 = decodeFloat16;
    lib.sinusoidalPositions = sinusoidalPositions;
  }

  // ------------------------------------------------------------------ the page

  function element(tag, attrs, parent, text) {
    var node = document.createElement(tag);
    for (var key in attrs || {}) node.setAttribute(key, attrs[key]);
    if (text !== undefined) node.textContent = text;
    if (parent) parent.appendChild(node);
    return node;
  }

  function svgElement(tag, attrs, parent) {
    var node = document.createElementNS("http://www.w3.org/2000/svg", tag);
    for (var key in attrs) node.setAttribute(key, attrs[key]);
    if (parent) parent.appendChild(node);
    return node;
  }

  function shown(ch) { return ch === "\n" ? "⏎" : ch === " " ? "␣" : ch; }

  // The grid of one model: a row per block, a column per head; each cell the attention matrix
  // (a short prompt) or the last token's row (a long one), darker for more weight; then the RMS.
  function drawInside(box, model, ids, vocab) {
    var seen = lib.inside(model, ids), n = seen.tokens.length, whole = n <= 16;
    var cell = 48, gap = 8, left = 52, top = 20, heads = model.config.num_heads, blocks = model.blocks.length;
    var height = whole ? cell : 14, width = left + heads * (cell + gap);
    var svg = svgElement("svg", { width: width, height: top + blocks * (height + gap) + 4, role: "img",
      "class": "d2l-lm-grid", "aria-label": model.name + ": attention weights per block and head" }, box);
    for (var head = 0; head < heads; head++) {
      svgElement("text", { x: left + head * (cell + gap) + cell / 2, y: 12, "font-size": 11, "text-anchor": "middle" },
                 svg).textContent = "head " + (head + 1);
    }
    seen.attention.forEach(function (perHead, b) {
      var y = top + b * (height + gap);
      svgElement("text", { x: 0, y: y + height / 2 + 4, "font-size": 11 }, svg).textContent = "block " + (b + 1);
      perHead.forEach(function (rows, head) {
        var x = left + head * (cell + gap);
        svgElement("rect", { x: x, y: y, width: cell, height: height, fill: "#f4f4f4" }, svg);
        (whole ? rows : [rows[n - 1]]).forEach(function (row, r) {
          row.forEach(function (w, j) {
            var square = svgElement("rect", { x: x + j * cell / n, y: y + r * height / (whole ? n : 1),
              width: cell / n, height: height / (whole ? n : 1), fill: "rgba(36, 113, 163, " + w.toFixed(3) + ")" }, svg);
            svgElement("title", {}, square).textContent = "'" + shown(vocab[seen.tokens[whole ? r : n - 1]]) +
              "' → '" + shown(vocab[seen.tokens[j]]) + "': " + w.toFixed(3);
          });
        });
      });
    });
    var table = element("table", { "class": "d2l-lm-rms", style: "font-size: 0.85em; margin-top: 0.3em;" }, box);
    var header = element("tr", {}, table), row = element("tr", {}, table);
    element("th", { style: "text-align: left; padding-right: 0.8em;" }, header, "stream RMS after");
    element("td", { style: "padding-right: 0.8em;" }, row, "");
    seen.rms.forEach(function (value, i) {
      element("th", { style: "padding-right: 0.8em;" }, header, i ? "block " + i : "embedding");
      element("td", { style: "padding-right: 0.8em;" }, row, value.toFixed(3));
    });
    element("div", { style: "font-size: 0.85em; color: #555;" }, box, whole
      ? "Each square: row p shows how position p of the prompt attends to positions 0 .. p."
      : "Each strip: how the prompt's last character attends to the last " + n + " characters.");
  }

  function init(root) {
    if (root.getAttribute("data-ready")) return;
    root.setAttribute("data-ready", "1");
    var spec = JSON.parse(root.querySelector("script[type='application/json']").textContent);
    var models = spec.models.map(function (m) { return new lib.LanguageModel(m); }), vocab = spec.vocab;
    var index = {};
    vocab.forEach(function (ch, i) { index[ch] = i; });
    var controls = element("div", { style: "display: flex; flex-wrap: wrap; gap: 0.4em 1.2em; margin-bottom: 0.4em;" }, root);
    var prompt = element("textarea", { "data-control": "prompt", rows: 2, cols: 60, "aria-label": "prompt",
                                       style: "width: 100%; font-family: monospace;" });
    prompt.value = spec.prompt;
    controls.appendChild(prompt);
    function labelled(text, input) {
      var label = element("label", {}, controls, text + " ");
      label.appendChild(input);
      return input;
    }
    var choice = labelled("model", element("select", { "data-control": "model" }));
    models.forEach(function (m, i) { element("option", { value: String(i) }, choice, m.name); });
    if (models.length > 1) element("option", { value: "all" }, choice, "side by side");
    choice.value = models.length > 1 ? "all" : "0";
    var temperature = labelled("temperature", element("input", { "data-control": "temperature", type: "range",
                                                                 min: 0, max: 2, step: 0.1, value: 0 }));
    var readout = element("span", { style: "display: inline-block; min-width: 5em;" }, temperature.parentNode);
    var topK = labelled("top-k", element("select", { "data-control": "top_k" }));
    [["0", "all"], ["1", "1"], ["3", "3"], ["5", "5"], ["10", "10"], ["20", "20"]].forEach(function (o) {
      element("option", { value: o[0] }, topK, o[1]);
    });
    var seed = labelled("seed", element("input", { "data-control": "seed", type: "number", min: 0, step: 1,
                                                   value: spec.seed, style: "width: 5em;" }));
    var length = labelled("new characters", element("input", { "data-control": "length", type: "number", min: 1,
                                                               max: 2000, step: 1, value: spec.max_new_tokens,
                                                               style: "width: 5em;" }));
    var button = element("button", { "data-control": "generate", type: "button" }, controls, "Generate");
    var stop = element("button", { "data-control": "stop", type: "button" }, controls, "Stop");
    var message = element("div", { "class": "d2l-lm-message", role: "alert",
                                    style: "color: #b03a2e; min-height: 1.2em; margin: 0.2em 0;" }, root);
    var outputs = element("div", { style: "display: flex; flex-wrap: wrap; gap: 1em;" }, root);
    var timing = element("div", { "class": "d2l-lm-timing", style: "font-size: 0.85em; color: #555;" }, root);
    var check = element("div", { "class": "d2l-lm-check", style: "font-size: 0.85em; color: #555;" }, root);
    var insides = element("div", { "class": "d2l-lm-inside", style: "display: flex; flex-wrap: wrap; gap: 1.5em;" }, root);
    var run = 0;  // the current generation; a new one (or Stop) ends the old one

    function settings() {
      var t = +temperature.value;
      readout.textContent = t === 0 ? "0 (greedy)" : t.toFixed(1);
      return { do_sample: t > 0, temperature: t, top_k: +topK.value || null, seed: Math.max(0, Math.floor(+seed.value || 0)) };
    }

    function encode(text) {
      if (!text.length) return { error: "Type a prompt first: the model continues the text you write." };
      var unknown = [];
      for (var i = 0; i < text.length; i++) if (!(text[i] in index) && unknown.indexOf(text[i]) < 0) unknown.push(text[i]);
      if (unknown.length) {
        return { error: "The model has never seen " + unknown.map(function (ch) { return "'" + shown(ch) + "'"; }).join(", ") +
                 ": its vocabulary is the " + vocab.length + " characters of its training text. Remove or replace " +
                 (unknown.length > 1 ? "them." : "it.") };
      }
      return { ids: Array.prototype.map.call(text, function (ch) { return index[ch]; }) };
    }

    // The prompt the page opened with, greedy: say whether the text is what PyTorch wrote (d2lmini.generate
    // on the same float16 weights, computed when the page was built).
    function compare(jobs, encoded, options, maxNew) {
      var expected = spec.pytorch_greedy || {};
      if (options.do_sample || prompt.value !== spec.prompt) return;
      check.textContent = jobs.map(function (job) {
        var theirs = expected[job.model.name], mine = job.text.textContent;
        if (theirs === undefined || maxNew > theirs.length) return "";
        theirs = theirs.slice(0, maxNew);
        var first = 0;
        while (first < mine.length && mine[first] === theirs[first]) first++;
        job.pre.setAttribute("data-agrees", String(mine === theirs));
        return job.model.name + (mine === theirs ? ": the same " + maxNew + " characters as d2lmini.generate in PyTorch"
          : ": differs from d2lmini.generate in PyTorch from character " + (first + 1));
      }).filter(Boolean).join("; ");
    }

    function start() {
      run += 1;
      var mine = run, options = settings(), encoded = encode(prompt.value);
      outputs.textContent = ""; insides.textContent = ""; timing.textContent = ""; check.textContent = "";
      root.setAttribute("data-state", "running");
      if (encoded.error) {
        message.textContent = encoded.error;
        root.setAttribute("data-state", "error");
        return;
      }
      message.textContent = "";
      var chosen = choice.value === "all" ? models : [models[+choice.value]];
      var maxNew = Math.max(1, Math.min(2000, Math.floor(+length.value || 1)));
      var jobs = chosen.map(function (model) {
        var box = element("div", { style: "flex: 1 1 20em; min-width: 16em;" }, outputs);
        element("div", { style: "font-weight: bold;" }, box, model.name);
        var pre = element("pre", { "class": "d2l-lm-output", "data-model": model.name,
                                   style: "white-space: pre-wrap; word-break: break-all; margin: 0.2em 0;" }, box);
        element("span", { style: "color: #777;" }, pre, prompt.value);
        var text = element("span", { "class": "d2l-lm-new" }, pre, "");
        var inner = element("div", { "data-model": model.name }, insides);
        element("div", { style: "font-weight: bold;" }, inner, model.name + ": inside, for the prompt");
        drawInside(inner, model, encoded.ids, vocab);
        return { model: model, generator: new lib.Generator(model, encoded.ids, options), text: text, ms: 0, done: 0, pre: pre };
      });
      function tick() {
        if (mine !== run) return;
        jobs.forEach(function (job) {
          var begin = performance.now(), token = job.generator.step();
          job.ms += performance.now() - begin;
          job.done += 1;
          job.text.textContent += vocab[token];
        });
        timing.textContent = jobs.map(function (job) {
          return job.model.name + ": " + (job.ms / job.done).toFixed(2) + " ms per character";
        }).join("; ");
        jobs.forEach(function (job) { job.pre.setAttribute("data-ms-per-token", (job.ms / job.done).toFixed(3)); });
        if (jobs[0].done < maxNew) { setTimeout(tick, 0); return; }
        compare(jobs, encoded, options, maxNew);
        root.setAttribute("data-state", "done");
      }
      tick();
    }

    button.addEventListener("click", start);
    stop.addEventListener("click", function () { run += 1; root.setAttribute("data-state", "stopped"); });
    temperature.addEventListener("input", settings);
    settings();
    root.setAttribute("data-state", "idle");
  }

  document.querySelectorAll(".d2l-lm-twin").forEach(init);
})();
