// Recorded (Gaussian, pixel) contributions of a forward rasterization (rasterize_record), replayed by
// the lift's aggregation passes (aggregate_sphere_replay) instead of compositing the views again.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "huge_alloc.h"

namespace rh3dgs {

// A growable array of trivially copyable T that the recording forward writes through raw cursors: room for a
// row segment's pairs is made once per segment (make_room), then each pair is three plain stores. With
// std::vector::push_back every pair paid a capacity check, and the byte store of its lane (a char store may
// alias anything) made the compiler reload the vectors' end pointers after it: a recording render of the lift
// benchmark's views cost 1.28x the plain one, now ~1.08x.
template <class T>
struct RecordBuffer {
  std::unique_ptr<T[], HugeDeleter> data{nullptr, HugeDeleter{0}};
  size_t n = 0, cap = 0;
  void reserve(size_t c) {
    if (c <= cap) return;
    auto d = huge_array<T>(c);  // uninitialised (only [0, n) is ever read), on huge pages, pooled
    if (n) std::memcpy(d.get(), data.get(), n * sizeof(T));
    data = std::move(d), cap = c;
  }
  T* end() { return data.get() + n; }
  const T* begin() const { return data.get(); }
  size_t size() const { return n; }
};

// Contributions recorded by one thread, in its traversal order: per row segment (Gaussian index,
// first pixel's flat index into [B, H, W], count), per contribution the pixel's lane in the row,
// w = alpha T and alpha; and where each of its tiles starts (tile, segment, contribution).
struct ThreadRecord {
  std::vector<int32_t> seg;
  RecordBuffer<uint8_t> lane;
  RecordBuffer<float> w, mass;
  std::vector<int64_t> tiles;  // [tile, first segment, first contribution] per tile visited

  void reserve(size_t n) { lane.reserve(n), w.reserve(n), mass.reserve(n), seg.reserve(n); }
  // room for k more contributions (a segment's: at most one per lane of the row) behind the cursors end()
  void make_room(size_t k) {
    if (w.n + k <= w.cap) return;
    const size_t c = std::max(2 * w.cap, w.n + k);
    lane.reserve(c), w.reserve(c), mass.reserve(c);
  }
  // the k contributions written at the cursors are recorded
  void commit(size_t k) { lane.n += k, w.n += k, mass.n += k; }
  void begin_tile(int64_t tile) { tiles.insert(tiles.end(), {tile, (int64_t)seg.size() / 3, (int64_t)w.size()}); }
  // after the pairs of one (Gaussian, row) segment: its header, when it added any
  void close_segment(size_t n_before, int64_t gi, int64_t pix0) {
    if (w.size() > n_before) seg.insert(seg.end(), {(int32_t)gi, (int32_t)pix0, (int32_t)(w.size() - n_before)});
  }
};

// One list per tile (in tile order, whatever thread recorded it): seg_offsets [n_tiles+1] int64 into
// segments [S, 3] int32 and pair_offsets [n_tiles+1] int64 into lanes [P] uint8, weights [P] and
// masses [P] float.
inline std::vector<at::Tensor> records_to_tensors(const std::vector<ThreadRecord>& records, int64_t n_tiles) {
  struct Piece {
    int64_t thread = -1, seg0 = 0, seg1 = 0, pair0 = 0, pair1 = 0;
  };
  std::vector<Piece> pieces(n_tiles);
  for (int64_t t = 0; t < (int64_t)records.size(); ++t) {
    const ThreadRecord& r = records[t];
    const int64_t n = (int64_t)r.tiles.size() / 3;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t* e = r.tiles.data() + 3 * i;
      const bool last = i + 1 == n;
      pieces[e[0]] = {t, e[1], last ? (int64_t)r.seg.size() / 3 : e[4], e[2], last ? (int64_t)r.w.size() : e[5]};
    }
  }
  auto seg_off = at::empty({n_tiles + 1}, at::kLong), pair_off = at::empty({n_tiles + 1}, at::kLong);
  int64_t* so = seg_off.data_ptr<int64_t>();
  int64_t* po = pair_off.data_ptr<int64_t>();
  so[0] = po[0] = 0;
  for (int64_t j = 0; j < n_tiles; ++j) {
    so[j + 1] = so[j] + pieces[j].seg1 - pieces[j].seg0;
    po[j + 1] = po[j] + pieces[j].pair1 - pieces[j].pair0;
  }
  // on huge pages: a lift's recording is ~13 bytes per contribution, hundreds of MB
  auto segs = empty_huge({so[n_tiles], 3}, at::kInt), lanes = empty_huge({po[n_tiles]}, at::kByte);
  auto ws = empty_huge({po[n_tiles]}, at::kFloat), masses = empty_huge({po[n_tiles]}, at::kFloat);
  int32_t* sg = segs.data_ptr<int32_t>();
  uint8_t* ln = lanes.data_ptr<uint8_t>();
  float* wo = ws.data_ptr<float>();
  float* mo = masses.data_ptr<float>();
  at::parallel_for(0, n_tiles, 16, [&](int64_t j0, int64_t j1) {
    for (int64_t j = j0; j < j1; ++j) {
      const Piece& q = pieces[j];
      if (q.thread < 0) continue;
      const ThreadRecord& r = records[q.thread];
      std::copy(r.seg.begin() + 3 * q.seg0, r.seg.begin() + 3 * q.seg1, sg + 3 * so[j]);
      std::copy(r.lane.begin() + q.pair0, r.lane.begin() + q.pair1, ln + po[j]);
      std::copy(r.w.begin() + q.pair0, r.w.begin() + q.pair1, wo + po[j]);
      std::copy(r.mass.begin() + q.pair0, r.mass.begin() + q.pair1, mo + po[j]);
    }
  });
  return {seg_off, pair_off, segs, lanes, ws, masses};
}

}  // namespace rh3dgs
