// The MPI transport (Open MPI): one communicator per group. MPI is
// initialised with MPI_THREAD_MULTIPLE, because each group has its own
// communication thread; a lower level is refused with a clear error.
// Errors return (MPI_ERRORS_RETURN) and become fsdp::Error.
#include <mpi.h>

#include <climits>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "fsdp/core/error.h"
#include "src/distributed/transport.h"

#define MPI_CHECK(expr)                                                         \
  do {                                                                          \
    int rc_ = (expr);                                                           \
    if (rc_ != MPI_SUCCESS) {                                                   \
      char msg_[MPI_MAX_ERROR_STRING];                                          \
      int len_ = 0;                                                             \
      MPI_Error_string(rc_, msg_, &len_);                                       \
      FSDP_FAIL("[mpi] {} failed: {}", #expr, std::string(msg_, size_t(len_))); \
    }                                                                           \
  } while (0)

namespace fsdp::dist {

namespace {

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::f32:
      return MPI_FLOAT;
    case DType::f64:
      return MPI_DOUBLE;
    case DType::i32:
      return MPI_INT32_T;
    case DType::i64:
      return MPI_INT64_T;
    default:
      FSDP_FAIL("[mpi] no MPI reduction for {}", dtype_name(t));
  }
}

int as_int(size_t n, const char* what) {
  FSDP_CHECK(n <= size_t(INT_MAX), "[mpi] {} of {} exceeds MPI's int count limit", what, n);
  return int(n);
}

class MpiTransport final : public Transport {
 public:
  explicit MpiTransport(MPI_Comm comm) : comm_(comm) {
    MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    MPI_CHECK(MPI_Comm_size(comm_, &size_));
  }
  ~MpiTransport() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "mpi"; }

  void all_gather(const void* in, void* out, size_t bytes) override {
    const int n = as_int(bytes, "all_gather bytes");
    MPI_CHECK(MPI_Allgather(in, n, MPI_BYTE, out, n, MPI_BYTE, comm_));
  }
  void all_reduce_sum(void* buf, size_t count, DType dtype) override {
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, buf, as_int(count, "all_reduce count"), mpi_type(dtype),
                            MPI_SUM, comm_));
  }
  void reduce_scatter_sum(const void* in, void* out, size_t count, DType dtype) override {
    MPI_CHECK(MPI_Reduce_scatter_block(in, out, as_int(count, "reduce_scatter count"),
                                       mpi_type(dtype), MPI_SUM, comm_));
  }
  void broadcast(void* buf, size_t bytes, int root) override {
    MPI_CHECK(MPI_Bcast(buf, as_int(bytes, "broadcast bytes"), MPI_BYTE, root, comm_));
  }
  void all_to_all(const void* in, void* out, size_t bytes) override {
    const int n = as_int(bytes, "all_to_all bytes");
    MPI_CHECK(MPI_Alltoall(in, n, MPI_BYTE, out, n, MPI_BYTE, comm_));
  }
  // MPI_Alltoallv counts and displacements are ints in units of one element (a contiguous type
  // of unit_bytes): a block or an offset past INT_MAX elements is refused, naming it.
  void all_to_all_v(const void* in, const std::vector<int64_t>& in_counts, void* out,
                    const std::vector<int64_t>& out_counts, size_t unit_bytes) override {
    std::vector<int> sc, sd, rc, rd;
    int64_t s_off = 0, r_off = 0;
    for (size_t j = 0; j < in_counts.size(); ++j) {
      sd.push_back(as_int(size_t(s_off), "all_to_all_v send offset (elements)"));
      sc.push_back(as_int(size_t(in_counts[j]), "all_to_all_v send count (elements)"));
      rd.push_back(as_int(size_t(r_off), "all_to_all_v receive offset (elements)"));
      rc.push_back(as_int(size_t(out_counts[j]), "all_to_all_v receive count (elements)"));
      s_off += in_counts[j];
      r_off += out_counts[j];
    }
    MPI_Datatype unit = MPI_DATATYPE_NULL;
    MPI_CHECK(
        MPI_Type_contiguous(as_int(unit_bytes, "all_to_all_v element bytes"), MPI_BYTE, &unit));
    MPI_CHECK(MPI_Type_commit(&unit));
    const int status =
        MPI_Alltoallv(in, sc.data(), sd.data(), unit, out, rc.data(), rd.data(), unit, comm_);
    MPI_Type_free(&unit);
    MPI_CHECK(status);  // after freeing the type
  }
  void barrier() override { MPI_CHECK(MPI_Barrier(comm_)); }
  std::unique_ptr<Transport> split(int color, int key, const std::vector<int>&, int, int) override {
    MPI_Comm sub = MPI_COMM_NULL;
    MPI_CHECK(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &sub));
    if (sub == MPI_COMM_NULL) return nullptr;
    return std::make_unique<MpiTransport>(sub);
  }

 private:
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
};

}  // namespace

std::unique_ptr<Transport> make_mpi_world_transport() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided));
    FSDP_CHECK(provided >= MPI_THREAD_MULTIPLE,
               "[mpi] the MPI library gave thread level {} but fsdp.cpp needs MPI_THREAD_MULTIPLE "
               "({}): each process "
               "group runs its collectives on its own thread",
               provided, MPI_THREAD_MULTIPLE);
  }
  MPI_Comm world = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &world));
  return std::make_unique<MpiTransport>(world);
}

void mpi_finalize() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Finalize();
}

void mpi_abort(int code) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
}

}  // namespace fsdp::dist
