// PackedSource (fsdp/data/chat.h): samples packed into rows of seq positions, with the document
// starts that keep them apart.
#include <fmt/core.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/core/error.h"
#include "fsdp/core/ignore_index.h"
#include "fsdp/core/tensor.h"
#include "fsdp/data/chat.h"
#include "fsdp/data/token_sources.h"

namespace fsdp::data {

PackedSource::PackedSource(std::string description, int32_t pad, int64_t seq)
    : description_(std::move(description)), pad_(pad), seq_(seq) {
  FSDP_CHECK(seq_ > 0, "[data] {}: seq must be positive, got {}", description_, seq_);
}

PackedSource::PackedSource(std::shared_ptr<const std::vector<TokenizedSample>> all, int64_t begin,
                           int64_t end, std::string description, int32_t pad, int64_t seq)
    : PackedSource(std::move(description), pad, seq) {
  all_ = std::move(all);
  pack(begin, end, [this](int64_t k) { return int64_t((*all_)[size_t(k)].ids.size()); });
}

std::unique_ptr<PackedSource> PackedSource::of_documents(std::shared_ptr<const TokenStream> stream,
                                                         int32_t eos, int64_t seq) {
  FSDP_CHECK(stream != nullptr, "[data] of_documents: no stream");
  std::unique_ptr<PackedSource> p(new PackedSource(
      fmt::format("{}, documents ending at token {}", stream->describe(), eos), eos, seq));
  // One pass over the stream in chunks, as a batch reads it (a shard's tokens checked there).
  constexpr int64_t kChunk = int64_t(1) << 20;
  const int64_t size = stream->size();
  p->doc_begin_.push_back(0);
  for (int64_t at = 0; at < size; at += kChunk) {
    const std::vector<int32_t> ids = stream->read(at, std::min(kChunk, size - at));
    for (size_t i = 0; i < ids.size(); ++i)
      if (ids[i] == eos && at + int64_t(i) + 1 < size) p->doc_begin_.push_back(at + int64_t(i) + 1);
  }
  p->doc_begin_.push_back(size);
  p->stream_ = std::move(stream);
  const std::vector<int64_t>& b = p->doc_begin_;
  p->pack(0, int64_t(b.size()) - 1, [&b](int64_t k) { return b[size_t(k + 1)] - b[size_t(k)]; });
  return p;
}

template <class Length>
void PackedSource::pack(int64_t begin, int64_t end, Length tokens) {
  row_begin_.push_back(0);
  int64_t used = 0;  // positions of the row being filled
  auto close_row = [&] {
    row_begin_.push_back(int64_t(pieces_.size()));
    used = 0;
  };
  for (int64_t k = begin; k < end; ++k) {
    const int64_t n = tokens(k) - 1;  // positions
    if (n <= 0) continue;
    ++samples_packed_;
    split_ += n > seq_;
    positions_ += n;
    for (int64_t off = 0; off < n; off += seq_) {
      const int64_t len = std::min(seq_, n - off);
      if (used + len > seq_) close_row();
      pieces_.push_back({k, off, len});
      used += len;
    }
  }
  if (used > 0) close_row();
  FSDP_CHECK(rows() > 0, "[data] {}: no sample has 2 tokens or more, nothing to pack",
             description_);
}

double PackedSource::fill() const { return double(positions_) / double(rows() * seq_); }

void PackedSource::set_shuffle(uint64_t seed) {
  shuffle_ = true;
  seed_ = seed;
}

Batch PackedSource::windows(int64_t first, int64_t rows, int64_t seq) const {
  FSDP_CHECK(first >= 0 && rows >= 0, "[data] windows({}, {}) of {}", first, rows, description_);
  FSDP_CHECK(seq == seq_, "[data] {} was packed into rows of {} positions; asked for {}",
             description_, seq_, seq);
  Tensor inputs = Tensor::empty({rows, seq}, DType::i32);
  Tensor targets = Tensor::empty({rows, seq}, DType::i32);
  Tensor doc_start = Tensor::empty({rows, seq}, DType::i32);
  const int64_t R = this->rows();
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t q = first + r;
    const int64_t row = shuffle_ ? shuffle_window(q % R, R, seed_, q / R) : q % R;
    int32_t* in = inputs.data<int32_t>() + r * seq;
    int32_t* tg = targets.data<int32_t>() + r * seq;
    int32_t* ds = doc_start.data<int32_t>() + r * seq;
    int64_t t = 0;
    for (int64_t p = row_begin_[size_t(row)]; p < row_begin_[size_t(row + 1)]; ++p) {
      const Piece& piece = pieces_[size_t(p)];
      const int32_t start = int32_t(t);
      if (stream_) {  // a document: every token a target
        const std::vector<int32_t> ids =
            stream_->read(doc_begin_[size_t(piece.sample)] + piece.offset, piece.length + 1);
        for (int64_t i = 0; i < piece.length; ++i, ++t) {
          in[t] = ids[size_t(i)];
          tg[t] = ids[size_t(i + 1)];
          ds[t] = start;
        }
        continue;
      }
      const TokenizedSample& s = (*all_)[size_t(piece.sample)];
      for (int64_t i = piece.offset; i < piece.offset + piece.length; ++i, ++t) {
        in[t] = s.ids[size_t(i)];
        tg[t] = s.target[size_t(i + 1)] ? s.ids[size_t(i + 1)] : int32_t(kIgnoreIndex);
        ds[t] = start;
      }
    }
    for (const int32_t start = int32_t(t); t < seq; ++t) {  // padding: a document of its own
      in[t] = pad_;
      tg[t] = int32_t(kIgnoreIndex);
      ds[t] = start;
    }
  }
  return {std::move(inputs), std::move(targets), std::move(doc_start)};
}

std::string PackedSource::describe() const {
  return fmt::format(
      "{} ({} {} packed into {} rows of --seq {}, {:.1f}% of positions filled; {} longer "
      "than --seq split into pieces; attention never crosses a {})",
      description_, samples_packed_, stream_ ? "documents" : "samples", rows(), seq_,
      100.0 * fill(), split_, stream_ ? "document" : "sample");
}

std::unique_ptr<PackedSource> SampleSource::packed() const {
  return std::unique_ptr<PackedSource>(
      new PackedSource(samples_, begin_, end_, description_, pad_, seq_));
}

}  // namespace fsdp::data
