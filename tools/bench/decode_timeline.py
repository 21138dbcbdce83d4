# EXPERIMENT companion: the timeline of the last decode step from a QVL_LINEAR_TRACE file, written by
# `QVL_LINEAR_TRACE=FILE qvl bench ... --batch 1 --decode-attention-trace` (this commit's code).
#   python3 tools/bench/decode_timeline.py FILE HIDDEN COPY_GBPS [fp8]
import struct, sys, statistics as st
from array import array
path, hidden, bw = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])  # bw in GB/s
fp8 = len(sys.argv) > 4 and sys.argv[4] == 'fp8'
raw = open(path, 'rb').read()
nslots, kslots, tsize, _ = struct.unpack_from('4i', raw, 0)
off = 16
mi = array('i'); mi.frombytes(raw[off:off + nslots * 16]); off += nslots * 16
meta = [tuple(mi[4 * i:4 * i + 4]) for i in range(nslots)]
L = array('q'); L.frombytes(raw[off:off + kslots * 1024 * 5 * 8]); off += kslots * 1024 * 5 * 8
A = array('q'); A.frombytes(raw[off:off + tsize * 8])
def blocks(s):
    return [L[(s * 1024 + b) * 5:(s * 1024 + b) * 5 + 5] for b in range(1024) if L[(s * 1024 + b) * 5] > 0]
def ablocks(l):
    return [A[(l * 256 + b) * 13:(l * 256 + b) * 13 + 13] for b in range(256) if A[(l * 256 + b) * 13] > 0]
# slots of the last step: the latest-ending slot, then back while within 3 ms
ends = []
for s in range(nslots):
    e = [b[4] for b in blocks(s) if b[4] > 0]
    ends.append(max(e) if e else 0)
tend = max(ends)
sel = [s for s in range(nslots) if ends[s] > tend - 3_000_000 and ends[s] > 0]
sel.sort(key=lambda s: ends[s])
t0 = None
rows = []
def kstats(s):
    b = blocks(s)
    c = lambda i: [x[i] for x in b]
    d = lambda i, j: [x[j] - x[i] for x in b]
    return dict(n=len(b), entry0=min(c(0)), entry1=max(c(0)), wait0=min(c(1)), wait1=max(c(1)),
                pro1=max(c(2)), math_med=st.median(c(3)), math1=max(c(3)), end=max(c(4)),
                ew=st.median(d(0, 1)), wp=st.median(d(1, 2)), wpmax=max(d(1, 2)), pm=st.median(d(2, 3)),
                pmmax=max(d(2, 3)), me=st.median(d(3, 4)), wait_med=st.median(c(1)), pro_med=st.median(c(2)))
ks = [(s, kstats(s)) for s in sel]
t0 = ks[0][1]['entry0']
# attention per layer: exit max, wait min, entry min
att = []
for l in range(64):
    a = ablocks(l)
    if len(a) == 0: break
    c = lambda i: [x[i] for x in a]
    att.append(dict(entry0=min(c(0)), wait0=min(c(2)), wait1=max(c(2)), end=max(c(7)), keys1=max(c(5)), part1=max(c(6))))
events = []
for s, k in ks:
    N, K, pro, glu = meta[s]
    events.append((k['end'], 'lin', s, N, K, pro, glu, k))
for l, a in enumerate(att):
    if a['end'] > t0: events.append((a['end'], 'att', l, a))
events.sort(key=lambda e: e[0])
prev_end = t0
tot = {}
det = {}
adet = []
esz = 1 if fp8 else 2
print(f"{'kernel':14s} {'blocks':>6s} {'entry0':>8s} {'wait0':>8s} {'wait1':>8s} {'math1':>8s} {'end':>8s} {'span':>7s} {'bytes_us':>8s}")
for e in events:
    if e[1] == 'lin':
        _, _, s, N, K, pro, glu, k = e
        name = 'lm_head' if N > 100000 else ('gate_up' if glu else ('qkv' if pro == 1 and N != 2 * K // 2 and K == hidden and N > hidden else ('down' if K > 2 * hidden and N == hidden else ('o_proj' if N == hidden else f'N{N}K{K}p{pro}'))))
        byts = N * K * (1 if (fp8 and N < 100000) else 2)
        span = (k['end'] - prev_end) / 1e3
        print(f"{name:14s} {k['n']:6d} {(k['entry0']-prev_end)/1e3:8.2f} {(k['wait0']-prev_end)/1e3:8.2f} {(k['wait1']-prev_end)/1e3:8.2f} {(k['math1']-prev_end)/1e3:8.2f} {(k['end']-prev_end)/1e3:8.2f} {span:7.2f} {byts/bw/1e3:8.2f}")
        tot.setdefault(name, []).append((span, byts / bw / 1e3))
        rel = lambda v: (v - prev_end) / 1e3
        det.setdefault(name, []).append([rel(k['entry0']), rel(k['entry1']), rel(k['wait0']), rel(k['wait_med']), rel(k['wait1']),
                                         rel(k['pro_med']), rel(k['pro1']), rel(k['math_med']), rel(k['math1']), rel(k['end']),
                                         k['ew'] / 1e3, k['wp'] / 1e3, k['wpmax'] / 1e3, k['pm'] / 1e3, k['pmmax'] / 1e3, k['me'] / 1e3])
        prev_end = k['end']
    else:
        _, _, l, a = e
        span = (a['end'] - prev_end) / 1e3
        print(f"{'attn L'+str(l):14s} {'':6s} {(a['entry0']-prev_end)/1e3:8.2f} {(a['wait0']-prev_end)/1e3:8.2f} {(a['wait1']-prev_end)/1e3:8.2f} {(a['keys1']-prev_end)/1e3:8.2f} {(a['end']-prev_end)/1e3:8.2f} {span:7.2f}")
        tot.setdefault('attention', []).append((span, 0))
        adet.append([(a[k] - prev_end) / 1e3 for k in ('entry0', 'wait0', 'wait1', 'keys1', 'part1', 'end')])
        prev_end = a['end']
print('--- per kernel, median over layers: span us (from the previous kernel end to this end), bytes us')
for k, v in tot.items():
    print(f"{k:10s} n={len(v):3d} span med {st.median(x[0] for x in v):6.2f} sum {sum(x[0] for x in v):8.1f} | bytes med {st.median(x[1] for x in v):6.2f} sum {sum(x[1] for x in v):8.1f}")
print(f"step span {(prev_end - t0)/1e3:.1f} us")
cols = ['entry0', 'entry1', 'wait0', 'waitmed', 'wait1', 'promed', 'pro1', 'mathmed', 'math1', 'end', 'b:e>w', 'b:w>p', 'b:w>pmax', 'b:p>m', 'b:p>mmax', 'b:m>end']
print('--- per kernel, medians over layers (us from the previous kernel end; b: per-block medians)')
print(f"{'':10s}" + ''.join(f'{c:>9s}' for c in cols))
for k, v in det.items():
    print(f"{k:10s}" + ''.join(f'{st.median(x[i] for x in v):9.2f}' for i in range(len(cols))))
print('attention medians (us from qkv end): entry0 wait0 wait1 keys_done1 partial1 end: ' + ' '.join(f'{st.median(x[i] for x in adet):.2f}' for i in range(6)))
