// The private interface each CPU transport implements (MPI, Gloo, local):
// blocking collectives on contiguous host buffers, called only from the
// group's communication thread, so one group never runs two at once.
// Reductions are sums of f32, f64, i32 or i64; the ProcessGroup widens bf16
// and f16 to f32 and turns AVG into a sum and a division. Counts are
// elements per rank.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fsdp/core/dtype.h"

namespace fsdp::dist {

class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;

  virtual void all_gather(const void* in, void* out, size_t bytes_per_rank) = 0;
  virtual void all_reduce_sum(void* buf, size_t count, DType dtype) = 0;
  virtual void reduce_scatter_sum(const void* in, void* out, size_t count_per_rank,
                                  DType dtype) = 0;
  virtual void broadcast(void* buf, size_t bytes, int root) = 0;
  virtual void all_to_all(const void* in, void* out, size_t bytes_per_rank) = 0;
  // Uneven all-to-all: rank j gets in_counts[j] units from in (blocks in rank order) and this
  // rank receives out_counts[j] units from rank j into out (the same). A unit is unit_bytes.
  virtual void all_to_all_v(const void* in, const std::vector<int64_t>& in_counts, void* out,
                            const std::vector<int64_t>& out_counts, size_t unit_bytes) = 0;
  virtual void barrier() = 0;
  // Collective over this group. `members` are the parent ranks of the new
  // group in order; `index` is this rank's place among them; `seq` numbers
  // the splits of this parent, the same on every rank.
  virtual std::unique_ptr<Transport> split(int color, int key, const std::vector<int>& members,
                                         int index, int seq) = 0;
};

std::unique_ptr<Transport> make_local_transport();
// The engines of optional libraries; in a build without one, src/distributed/stubs/ throws naming it.
std::unique_ptr<Transport> make_mpi_world_transport();  // MPI_COMM_WORLD, initialising MPI if needed
void mpi_finalize();
void mpi_abort(int code);
class TCPStore;
std::unique_ptr<Transport> make_gloo_transport(std::shared_ptr<TCPStore> store, int rank, int size,
                                           const std::string& hostname);

}  // namespace fsdp::dist
