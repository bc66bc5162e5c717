// attention_kv.wgsl — `attention_kv`: attention.wgsl's prefill (queries roped, every key and
// value in the cache) with one workgroup per (KV head, block of tokens) instead of one per (query
// head, token), so that each key and value a workgroup loads serves all its query rows. After
// seq_params.wgsl, q8_act.wgsl, attention_fold.wgsl and attention_part.wgsl; the bindings are
// attention_cached.wgsl's (binding 7, the split's partials, is not read).
//
// Rows: a workgroup takes TB consecutive tokens of the sequence and, for each, the group's query
// heads (group = n_head / n_kv_head): row r = (token wg.y * TB + r / group, query head kvh * group
// + r % group), TB * group <= RMAX = 16 rows. Dispatch (n_kv_head, ceil(n_tok / TB)), workgroups
// of 256 threads; TB = ceil(n_tok / grid height), chosen by the host (attention_kv.rs). Head_dim
// a multiple of 8, at most 128 (two value pairs per thread and row). Queries are read from Q
// where they are used (uniform addresses): a copy in workgroup memory measured slower, as the
// smaller workgroup memory lets more workgroups share an SM.
//
// Same bits as attention.wgsl, operation for operation (attention.wgsl's header gives the order):
// per (row, key) the score is one fused multiply-add chain over head_dim in element order, times
// `scale`; per (row, tile of 32 keys) the max, then e = exp(s - m) and l = the sum of the e's in
// key order, and per (row, element) o = the fused multiply-add chain of e * value in key order;
// the chunk's 8 tiles merged in tile order with exp(m_g - max_g m_g), the chunks folded in chunk
// order (`fold`), the result o / l. Only the work is placed differently, in four phases per chunk
// of 256 keys:
// * scores: thread i takes key i of the chunk, loads it 32 elements at a time and continues every
//   row's chain with them (the chains wait in `es` between blocks; Q is rows of vec4 here: q_stride
//   and head_dim are multiples of 4);
// * tiles: thread (r, g), r < RMAX, g < 8, takes row r's tile g: its max m, e = exp(s - m) in
//   place of the scores, and l;
// * values, head_dim <= 64 (one value pair per lane): thread (g = i / 32, pair i % 32) walks tile
//   g for every row, each key's value pair loaded once for all of them (walk_rows); the tiles' o
//   go through `es` to thread (row r0 = i / 32 and r0 + 8, pair i % 32), which merges its rows'
//   tiles in tile order and folds the chunk into their running partials. Head_dim over 64: that
//   thread walks the 8 tiles itself (value pairs i % 32 and i % 32 + 32, each key's pair loaded
//   once for both rows; tile_walk);
// * after the last chunk the rows' outputs go through `es` to attention_part.wgsl's writers,
//   head_dim / 4 threads per row (O, and the Q8 rows when p.q8_out).

@group(0) @binding(1) var<storage, read> Q: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> KC: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> VC: array<u32>;
@group(0) @binding(6) var<storage, read_write> Q8O: array<vec4<u32>>;

const RMAX: u32 = 16u;    // query rows per workgroup
const TS: u32 = 36u;      // `es` stride between a row's tiles: 32 scores + 4 (vec4-aligned)
const ES_ROW: u32 = 292u; // `es` stride between rows: 8 tiles + 4 (spreads rows over banks)
const KL: u32 = 32u;      // keys per tile (attention.wgsl's L)

// [RMAX][ES_ROW] f32, read 4 at a time: the chunk's scores, then their e = exp(s - m), then
// (head_dim <= 64) the tiles' o on their way to the rows' owners (stage_at); at the end the rows'
// outputs [RMAX][head_dim]
var<workgroup> es: array<vec4<f32>, 1168>;
// [RMAX][8] each row's tile maxima and sums of the current chunk
var<workgroup> tm: array<f32, 128>;
var<workgroup> tl: array<f32, 128>;
// per row: (token row t, query head h, key count n, first key k0 of the window); n = 0 for rows
// past the sequence
var<workgroup> rows: array<vec4<u32>, 16>;
// over the live rows: first chunk, end chunk, fewest first key, most keys
var<workgroup> span: vec4<u32>;

fn es_get(i: u32) -> f32 {
    return es[i >> 2u][i & 3u];
}

fn es_set(i: u32, v: f32) {
    es[i >> 2u][i & 3u] = v;
}

// Elements e .. e + 7 of KC (e a multiple of 8) as f32.
struct K8 {
    a: vec4<f32>,
    b: vec4<f32>,
}

fn key8(e: u32) -> K8 {
    if (p.kv_f16 != 0u) {
        let w = KC[e >> 3u];
        return K8(vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y)), vec4<f32>(unpack2x16float(w.z), unpack2x16float(w.w)));
    }
    return K8(bitcast<vec4<f32>>(KC[e >> 2u]), bitcast<vec4<f32>>(KC[(e >> 2u) + 1u]));
}

// acc continued by q · k over 8 elements (q: Q[qi], Q[qi + 1]), one fused multiply-add each, in
// element order.
fn dot8(acc: f32, qi: u32, k: K8) -> f32 {
    let qa = Q[qi];
    let qb = Q[qi + 1u];
    var s = fma(qa.x, k.a.x, acc);
    s = fma(qa.y, k.a.y, s);
    s = fma(qa.z, k.a.z, s);
    s = fma(qa.w, k.a.w, s);
    s = fma(qb.x, k.b.x, s);
    s = fma(qb.y, k.b.y, s);
    s = fma(qb.z, k.b.z, s);
    return fma(qb.w, k.b.w, s);
}

// Keys row `row` takes in the tile starting at key `start` (0: none; attention.wgsl's nk).
fn tile_keys(row: vec4<u32>, start: u32) -> u32 {
    if (start < row.z && start + KL > row.w) {
        return min(KL, row.z - start);
    }
    return 0u;
}

// A thread's value slot of the key whose elements start at e: pairs (e, e + 1) and, when `two`,
// (e + 64, e + 65) of VC.
fn slot(e: u32, two: bool) -> vec4<f32> {
    if (two) {
        return vec4<f32>(v_pair(e), v_pair(e + 64u));
    }
    return vec4<f32>(v_pair(e), 0.0, 0.0);
}

// Four keys' slots, keys hd elements apart from e on (loads only).
struct V4 {
    a: vec4<f32>,
    b: vec4<f32>,
    c: vec4<f32>,
    d: vec4<f32>,
}

fn slots4(e: u32, hd: u32, two: bool) -> V4 {
    return V4(slot(e, two), slot(e + hd, two), slot(e + 2u * hd, two), slot(e + 3u * hd, two));
}

// o continued by e * v: one fused multiply-add per element (the second pair only when `two`).
fn acc1(o: vec4<f32>, e: f32, v: vec4<f32>, two: bool) -> vec4<f32> {
    if (two) {
        return fma(vec4<f32>(e), v, o);
    }
    return vec4<f32>(fma(vec2<f32>(e), v.xy, o.xy), 0.0, 0.0);
}

// Four keys in key order.
fn acc4(o: vec4<f32>, e: vec4<f32>, v: V4, two: bool) -> vec4<f32> {
    return acc1(acc1(acc1(acc1(o, e.x, v.a, two), e.y, v.b, two), e.z, v.c, two), e.w, v.d, two);
}

struct O2 {
    a: vec4<f32>,
    b: vec4<f32>,
}

// One tile's o of the thread's two rows (e weights at es vec4 ia and ib on, nka and nkb keys,
// values from element vb on): 16 keys at a time while both rows take them (the 16 keys' loads
// first, then the chains in key order), then key by key.
fn tile_walk(ia: u32, ib: u32, vb: u32, hd: u32, nka: u32, nkb: u32, two: bool) -> O2 {
    var oa = vec4<f32>(0.0);
    var ob = vec4<f32>(0.0);
    let both = min(nka, nkb);
    var k = 0u;
    for (; k + 16u <= both; k += 16u) {
        let e0 = vb + k * hd;
        let v0 = slots4(e0, hd, two);
        let v1 = slots4(e0 + 4u * hd, hd, two);
        let v2 = slots4(e0 + 8u * hd, hd, two);
        let v3 = slots4(e0 + 12u * hd, hd, two);
        let q = k / 4u;
        oa = acc4(acc4(acc4(acc4(oa, es[ia + q], v0, two), es[ia + q + 1u], v1, two), es[ia + q + 2u], v2, two), es[ia + q + 3u], v3, two);
        ob = acc4(acc4(acc4(acc4(ob, es[ib + q], v0, two), es[ib + q + 1u], v1, two), es[ib + q + 2u], v2, two), es[ib + q + 3u], v3, two);
    }
    let n = max(nka, nkb);
    for (; k < n; k++) {
        let v = slot(vb + k * hd, two);
        if (k < nka) {
            oa = acc1(oa, es_get(4u * ia + k), v, two);
        }
        if (k < nkb) {
            ob = acc1(ob, es_get(4u * ib + k), v, two);
        }
    }
    return O2(oa, ob);
}

// Four rows' o for one value pair (rows r .. r + 3 of walk_rows), and all 16 rows' in registers:
// written out, not an array, so that they stay there.
struct Q4 {
    a: vec2<f32>,
    b: vec2<f32>,
    c: vec2<f32>,
    d: vec2<f32>,
}

struct W16 {
    q0: Q4,
    q1: Q4,
    q2: Q4,
    q3: Q4,
}

// Four keys' value pairs (loads only), in the same shape.
alias P4 = Q4;

// Row r's o continued by keys 4i .. 4i + 3 of tile tg (e weights at es vec4 r * ES_ROW / 4 +
// tg * TS / 4 + i): one fused multiply-add per key and element, in key order.
fn row4(o: vec2<f32>, r: u32, tg: u32, i: u32, v: P4) -> vec2<f32> {
    let e = es[r * (ES_ROW / 4u) + tg * (TS / 4u) + i];
    return fma(vec2<f32>(e.w), v.d, fma(vec2<f32>(e.z), v.c, fma(vec2<f32>(e.y), v.b, fma(vec2<f32>(e.x), v.a, o))));
}

// Rows r .. r + 3 continued by keys 4i .. 4i + 3 (row4).
fn quad4(q: Q4, r: u32, tg: u32, i: u32, v: P4) -> Q4 {
    return Q4(row4(q.a, r, tg, i, v), row4(q.b, r + 1u, tg, i, v), row4(q.c, r + 2u, tg, i, v), row4(q.d, r + 3u, tg, i, v));
}

// Keys 4i .. 4i + 3 (P4 v) into rows 0 .. 15 where the block of four rows has a live row.
fn walk4(w: W16, nr: u32, tg: u32, i: u32, v: P4) -> W16 {
    var o = w;
    o.q0 = quad4(o.q0, 0u, tg, i, v);
    if (nr > 4u) {
        o.q1 = quad4(o.q1, 4u, tg, i, v);
    }
    if (nr > 8u) {
        o.q2 = quad4(o.q2, 8u, tg, i, v);
    }
    if (nr > 12u) {
        o.q3 = quad4(o.q3, 12u, tg, i, v);
    }
    return o;
}

// Tile tg (keys from `start` on) walked for every row, value pair pl (head_dim <= 64): the keys
// up to the most any live row takes, every row's chain over all of them. A row's e is 0 past its
// own keys (exp(NEG - m) underflows; a tile it does not take at all was zeroed), and a fused
// multiply-add of 0 leaves the chain's bits as they are (the chain is never -0: it starts at
// +0), so each row gets the bits of a walk over its own keys alone (tile_walk's).
fn walk_rows(start: u32, nr: u32, kv0: u32, hd: u32, pl: u32, tg: u32) -> W16 {
    let z = vec2<f32>(0.0);
    let zq = Q4(z, z, z, z);
    var o = W16(zq, zq, zq, zq);
    var nk = 0u;
    for (var r = 0u; r < nr; r++) {
        nk = max(nk, tile_keys(rows[r], start));
    }
    if (2u * pl >= hd) {
        // no value pair of this lane (head_dim under 64)
        return o;
    }
    let vb = (kv0 + start) * hd + 2u * pl;
    var k = 0u;
    for (; k + 4u <= nk; k += 4u) {
        let e = vb + k * hd;
        o = walk4(o, nr, tg, k / 4u, P4(v_pair(e), v_pair(e + hd), v_pair(e + 2u * hd), v_pair(e + 3u * hd)));
    }
    if (k < nk) {
        // the last 1-3 keys; the rest of the four get value 0 (not loaded) and, past every row's
        // keys, weight 0: fma(0, 0, o) is o
        let e = vb + k * hd;
        let n = nk - k;
        var v = P4(v_pair(e), z, z, z);
        if (n > 1u) {
            v.b = v_pair(e + hd);
        }
        if (n > 2u) {
            v.c = v_pair(e + 2u * hd);
        }
        o = walk4(o, nr, tg, k / 4u, v);
    }
    return o;
}

// Staged tile o of row r0 + rr (rr < 8), tile tg, pair pl: [8 rows][8 tiles][32 pairs] vec2 in
// `es` (4096 floats; the e weights are no longer needed).
fn stage_at(rr: u32, tg: u32, pl: u32) -> u32 {
    return 2u * ((rr * 8u + tg) * 32u + pl);
}

fn stage1(rr: u32, tg: u32, pl: u32, v: vec2<f32>) {
    let i = stage_at(rr, tg, pl);
    es_set(i, v.x);
    es_set(i + 1u, v.y);
}

// Rows rr .. rr + 3 of the stage from q.
fn stage4(q: Q4, rr: u32, tg: u32, pl: u32) {
    stage1(rr, tg, pl, q.a);
    stage1(rr + 1u, tg, pl, q.b);
    stage1(rr + 2u, tg, pl, q.c);
    stage1(rr + 3u, tg, pl, q.d);
}

// Rows r0 .. r0 + 7 (r0 = 0 or 8) of walk_rows' o (tile tg, pair pl) into the stage.
fn stage_rows(w: W16, r0: u32, tg: u32, pl: u32) {
    if (r0 == 0u) {
        stage4(w.q0, 0u, tg, pl);
        stage4(w.q1, 4u, tg, pl);
    } else {
        stage4(w.q2, 0u, tg, pl);
        stage4(w.q3, 4u, tg, pl);
    }
}

fn staged(rr: u32, tg: u32, pl: u32) -> vec2<f32> {
    let i = stage_at(rr, tg, pl);
    return vec2<f32>(es_get(i), es_get(i + 1u));
}

// Row r's 8 tiles (staged at stage row rr, pair pl) merged in tile order with the tiles' maxima
// and sums, as the head_dim > 64 walk merges its own: (l, o of the pair).
fn merge_staged(r: u32, rr: u32, pl: u32, mx: f32) -> vec3<f32> {
    var l = 0.0;
    var o = vec2<f32>(0.0);
    for (var tg = 0u; tg < 8u; tg++) {
        let f = exp(tm[r * 8u + tg] - mx);
        l = fma(tl[r * 8u + tg], f, l);
        o = fma(staged(rr, tg, pl), vec2<f32>(f), o);
    }
    return vec3<f32>(l, o);
}

// A thread's two rows' running partials (Part4: its 4 elements, attention_fold.wgsl).
struct Row2 {
    a: Part4,
    b: Part4,
}

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let kvh = wg.x;
    let hd = p.head_dim;
    let group = p.n_head / p.n_kv_head;
    // tokens per workgroup, from the grid (the host keeps tpb * group <= RMAX)
    let tpb = (p.n_tok + nwg.y - 1u) / nwg.y;
    let nr = tpb * group;
    if (li < RMAX) {
        var row = vec4<u32>(0u);
        let tt = wg.y * tpb + li / group;
        if (li < nr && tt < p.n_tok) {
            let t = p.t0 + tt;
            let n = POS[t] + 1u;
            var k0 = 0u;
            if (p.window != 0u && n > p.window) {
                k0 = n - p.window;
            }
            row = vec4<u32>(t, kvh * group + li % group, n, k0);
        }
        rows[li] = row;
    }
    workgroupBarrier();
    if (li == 0u) {
        var s = vec4<u32>(0xFFFFFFFFu, 0u, 0xFFFFFFFFu, 0u);
        for (var r = 0u; r < RMAX; r++) {
            let row = rows[r];
            if (row.z > 0u) {
                s = vec4<u32>(min(s.x, row.w / C), max(s.y, (row.z + C - 1u) / C), min(s.z, row.w), max(s.w, row.z));
            }
        }
        if (s.y == 0u) {
            s.x = 0u;
        }
        span = s;
    }
    workgroupBarrier();
    let sp = workgroupUniformLoad(&span);
    let kv0 = kvh * p.capacity;
    // scores phase: thread li is key lane of tile g; values phase: the same numbers are rows
    // ra and ra + 8, value pairs pl and pl + 32
    let g = li / KL;
    let lane = li % KL;
    let ra = g;
    let pl = lane;
    let two = pl + 32u < hd / 2u;
    var run = Row2(Part4(NEG, 0.0, vec4<f32>(0.0)), Part4(NEG, 0.0, vec4<f32>(0.0)));
    for (var c = sp.x; c < sp.y; c++) {
        // scores: key j for every row that takes it
        let j = c * C + li;
        let need = j < sp.w && j >= sp.z;
        let kb = (kv0 + j) * hd;
        let ei = g * TS + lane;
        var d = 0u;
        for (; d < hd; d += 32u) {
            let full = d + 32u <= hd;
            var k0 = K8(vec4<f32>(0.0), vec4<f32>(0.0));
            var k1 = k0;
            var k2 = k0;
            var k3 = k0;
            if (need) {
                k0 = key8(kb + d);
                if (full) {
                    k1 = key8(kb + d + 8u);
                    k2 = key8(kb + d + 16u);
                    k3 = key8(kb + d + 24u);
                }
            }
            for (var r = 0u; r < nr; r++) {
                let row = rows[r];
                if (need && j < row.z && j >= row.w) {
                    let i = r * ES_ROW + ei;
                    var s = 0.0;
                    if (d > 0u) {
                        s = es_get(i);
                    }
                    let qr = (row.x * p.q_stride + row.y * hd) / 4u;
                    let qi = qr + d / 4u;
                    if (full) {
                        s = dot8(dot8(dot8(dot8(s, qi, k0), qi + 2u, k1), qi + 4u, k2), qi + 6u, k3);
                    } else {
                        // the last elements, 8 at a time (head_dim not a multiple of 32)
                        s = dot8(s, qi, k0);
                        for (var dd = d + 8u; dd < hd; dd += 8u) {
                            s = dot8(s, qr + dd / 4u, key8(kb + dd));
                        }
                    }
                    es_set(i, s);
                }
            }
            if (!full) {
                break;
            }
        }
        for (var r = 0u; r < nr; r++) {
            let row = rows[r];
            let i = r * ES_ROW + ei;
            if (need && j < row.z && j >= row.w) {
                es_set(i, es_get(i) * p.scale);
            } else {
                es_set(i, NEG);
            }
        }
        workgroupBarrier();
        // tiles: row tr's tile tg
        if (li < nr * 8u) {
            let tr = li / 8u;
            let tg = li % 8u;
            let nk = tile_keys(rows[tr], c * C + tg * KL);
            var m = NEG;
            var l = 0.0;
            let b = (tr * ES_ROW + tg * TS) / 4u;
            if (nk == 0u) {
                // no key of this tile: e = 0 for the tile walk (walk_rows reads every row)
                for (var k = 0u; k < 8u; k++) {
                    es[b + k] = vec4<f32>(0.0);
                }
            } else {
                // the max is exact in any order; keys past nk hold NEG
                var t4 = vec4<f32>(NEG);
                for (var k = 0u; k < 8u; k++) {
                    t4 = max(t4, es[b + k]);
                }
                m = max(max(t4.x, t4.y), max(t4.z, t4.w));
                for (var k = 0u; k < 8u; k++) {
                    let e = exp(es[b + k] - vec4<f32>(m));
                    es[b + k] = e;
                    let n = nk - min(nk, 4u * k);
                    if (n >= 4u) {
                        l = l + e.x + e.y + e.z + e.w;
                    } else {
                        if (n > 0u) {
                            l = l + e.x;
                        }
                        if (n > 1u) {
                            l = l + e.y;
                        }
                        if (n > 2u) {
                            l = l + e.z;
                        }
                    }
                }
            }
            tm[li] = m;
            tl[li] = l;
        }
        workgroupBarrier();
        // values: rows ra and rb, each tile's o in key order, merged in tile order
        let rb = ra + 8u;
        let rowa = rows[ra];
        let rowb = rows[rb];
        var mxa = NEG;
        var mxb = NEG;
        for (var k = 0u; k < 8u; k++) {
            mxa = max(mxa, tm[ra * 8u + k]);
            mxb = max(mxb, tm[rb * 8u + k]);
        }
        var suma = 0.0;
        var sumb = 0.0;
        var acca = vec4<f32>(0.0);
        var accb = vec4<f32>(0.0);
        if (hd <= 64u) {
            // one value pair per lane: group g walks tile g for every row (each value loaded once
            // for all of them), the tiles' o pass through `es` (8 rows at a time) to the threads
            // that own the rows, which merge them in tile order
            let w = walk_rows(c * C + g * KL, nr, kv0, hd, pl, g);
            workgroupBarrier();
            stage_rows(w, 0u, g, pl);
            workgroupBarrier();
            let a = merge_staged(ra, ra, pl, mxa);
            suma = a.x;
            acca = vec4<f32>(a.yz, 0.0, 0.0);
            if (nr > 8u) {
                workgroupBarrier();
                stage_rows(w, 8u, g, pl);
                workgroupBarrier();
                let b = merge_staged(rb, ra, pl, mxb);
                sumb = b.x;
                accb = vec4<f32>(b.yz, 0.0, 0.0);
            }
        } else {
            for (var tg = 0u; tg < 8u; tg++) {
                let start = c * C + tg * KL;
                var nka = 0u;
                var nkb = 0u;
                if (ra < nr) {
                    nka = tile_keys(rowa, start);
                }
                if (rb < nr) {
                    nkb = tile_keys(rowb, start);
                }
                let ia = (ra * ES_ROW + tg * TS) / 4u;
                let ib = (rb * ES_ROW + tg * TS) / 4u;
                let vb = (kv0 + start) * hd + 2u * pl;
                // literal `two`: each call specialized
                var o: O2;
                if (two) {
                    o = tile_walk(ia, ib, vb, hd, nka, nkb, true);
                } else {
                    o = tile_walk(ia, ib, vb, hd, nka, nkb, false);
                }
                let oa = o.a;
                let ob = o.b;
                let fa = exp(tm[ra * 8u + tg] - mxa);
                suma = fma(tl[ra * 8u + tg], fa, suma);
                acca = fma(oa, vec4<f32>(fa), acca);
                let fb = exp(tm[rb * 8u + tg] - mxb);
                sumb = fma(tl[rb * 8u + tg], fb, sumb);
                accb = fma(ob, vec4<f32>(fb), accb);
            }
        }
        // the chunk folds into a row whose keys it holds (attention.wgsl walks only those)
        if (ra < nr && c >= rowa.w / C && c * C < rowa.z) {
            run.a = fold4(run.a, Part4(mxa, suma, acca));
        }
        if (rb < nr && c >= rowb.w / C && c * C < rowb.z) {
            run.b = fold4(run.b, Part4(mxb, sumb, accb));
        }
        workgroupBarrier();
    }
    // outputs: o / l of each row into es, [RMAX][head_dim]
    for (var k = 0u; k < 2u; k++) {
        let r = ra + 8u * k;
        var pr = run.a;
        if (k == 1u) {
            pr = run.b;
        }
        // element by element, as attention_part.wgsl's finish
        var v = vec4<f32>(0.0);
        if (pr.l > 0.0) {
            v = vec4<f32>(pr.o.x / pr.l, pr.o.y / pr.l, pr.o.z / pr.l, pr.o.w / pr.l);
        }
        if (r < nr && 2u * pl < hd) {
            es_set(r * hd + 2u * pl, v.x);
            es_set(r * hd + 2u * pl + 1u, v.y);
            if (two) {
                es_set(r * hd + 2u * pl + 64u, v.z);
                es_set(r * hd + 2u * pl + 65u, v.w);
            }
        }
    }
    workgroupBarrier();
    // head_dim / 4 threads per row: 4 values each
    let q4 = hd / 4u;
    for (var s0 = 0u; s0 < nr * q4; s0 += 256u) {
        let s = s0 + li;
        var row = vec4<u32>(0u);
        if (s < nr * q4) {
            row = rows[s / q4];
        }
        let live = row.z > 0u;
        let d = (s % q4) * 4u;
        var v = vec4<f32>(0.0);
        if (live) {
            v = es[s];
            for (var i = 0u; i < 4u; i++) {
                O[o_index(row.x, row.y, d + i)] = v[i];
            }
        }
        if (p.q8_out != 0u) {
            let q = q8_coop(li, v);
            if (live) {
                q8_put(row.x, row.y, d, q);
            }
        }
    }
}
