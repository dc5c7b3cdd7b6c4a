// checkpoint::Manager: the folder's lock, the one-run-per-folder rule, the resume policy, the
// retention policy (keep) and the save entry point (manager.h). The files themselves are
// checkpoint.cpp's and async_save.cpp's; this file decides which folder is loaded, whether a run
// may write into D at all, which checkpoints are kept, and makes every rank agree on it.
//
// The lock is an flock(2) on D/.lock taken by rank 0 only: rank 0 is the rank that renames,
// prunes and clears folders, and the ranks of one job on a shared filesystem must not lock each
// other out. The file is never removed (removing it would let a third job lock a new inode while
// the second still holds the old one); its contents only name the last holder.
#include "fsdp/checkpoint/manager.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <compare>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <system_error>
#include <type_traits>
#include <utility>

#include "fsdp/checkpoint/async_save.h"
#include "fsdp/core/error.h"
#include "fsdp/core/file.h"
#include "fsdp/core/tensor.h"

namespace fsdp::checkpoint {

namespace fs = std::filesystem;

namespace {

int rank_of(const std::shared_ptr<dist::ProcessGroup>& world) { return world ? world->rank() : 0; }

// Collective: every rank learns how many ranks failed. A rank that failed throws its own error;
// the others get the count, to refuse naming it.
int64_t agree(const std::string& error, const std::shared_ptr<dist::ProcessGroup>& world) {
  double failed = error.empty() ? 0 : 1;
  if (world && world->size() > 1) {
    Tensor t = Tensor::full({1}, failed, DType::f32).to(world->device());
    world->all_reduce(t, dist::ReduceOp::SUM)->wait();
    failed = t.item();
  }
  if (!error.empty()) throw Error(error);
  return int64_t(failed);
}

// A RunState's parts: each names a part, under a name of its own.
void check_parts(const RunState& run) {
  for (size_t i = 0; i < run.parts.size(); ++i) {
    const StatePart& p = run.parts[i];
    FSDP_CHECK(p.part && !p.name.empty(), "[checkpoint] RunState part {} ('{}') has {}", i, p.name,
               p.part ? "no name" : "no Stateful");
    for (size_t k = 0; k < i; ++k)
      FSDP_CHECK(run.parts[k].name != p.name, "[checkpoint] RunState names two parts '{}'", p.name);
  }
}

// extras' user JSON (an object) with each part's state under its name.
std::string with_parts(const RunState& run, const std::string& user_json) {
  nlohmann::json user = nlohmann::json::parse(user_json, nullptr, false);
  FSDP_CHECK(user.is_object(),
             "[checkpoint] save: with RunState parts the extras' user JSON must be an object, "
             "got {}",
             user_json.substr(0, 200));
  for (const StatePart& p : run.parts) {
    FSDP_CHECK(!user.contains(p.name),
               "[checkpoint] save: the extras' user JSON has a key '{}', the name of a part",
               p.name);
    const std::string state = p.part->state_dict();
    nlohmann::json value = nlohmann::json::parse(state, nullptr, false);
    FSDP_CHECK(!value.is_discarded(),
               "[checkpoint] save: part '{}' gave a state that is not JSON: {}", p.name,
               state.substr(0, 200));
    user[p.name] = std::move(value);
  }
  return user.dump();
}

// Each part's state from a loaded checkpoint's "user" object.
void restore_parts(const RunState& run, const Loaded& loaded, const std::string& path) {
  const nlohmann::json user = nlohmann::json::parse(loaded.user_json, nullptr, false);
  const std::string meta = (fs::path(path) / "metadata.json").string();
  std::string held;
  if (user.is_object())
    for (const auto& [k, v] : user.items()) held += (held.empty() ? "" : ", ") + k;
  for (const StatePart& p : run.parts) {
    if (!user.is_object() || !user.contains(p.name)) {
      FSDP_CHECK(!p.required,
                 "[checkpoint] resume: {}: user holds no state of the run's part '{}' (it holds: "
                 "{}); the checkpoint is of a run without it",
                 meta, p.name, held.empty() ? "none" : held);
      continue;
    }
    p.part->load_state_dict(user[p.name].dump(), meta + ": user." + p.name);
  }
}

// "pid 1234 on host node7 since 2026-12-01 23:50:01 UTC": who holds the lock.
std::string holder_record() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "?");
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  ::gmtime_r(&now, &utc);
  char when[64] = {};
  std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", &utc);
  return fmt::format("pid {} on host {} since {}", ::getpid(), host, when);
}

// Rank 0: D/.lock, locked for this process's life (the kernel releases it on death), with this
// process's record in it; a held lock is refused naming its holder.
int take_lock(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  FSDP_CHECK(!ec, "[checkpoint] cannot create '{}': {}", dir, ec.message());
  const std::string path = (fs::path(dir) / ".lock").string();
  const int fd = open_for_write(path, O_RDWR | O_CREAT, "[checkpoint] the lock file");
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    ::close(fd);
    FSDP_CHECK(err == EWOULDBLOCK, "[checkpoint] cannot lock '{}': {}", path, std::strerror(err));
    std::ifstream f(path);
    std::string holder((std::istreambuf_iterator<char>(f)), {});
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
    FSDP_FAIL(
        "[checkpoint] {} is in use by another job ({}; it holds {}): two runs in one "
        "checkpoint folder replace each other's checkpoints; wait for it to end or choose "
        "another folder",
        dir, holder.empty() ? "it has not recorded itself yet" : holder, path);
  }
  const std::string record = holder_record() + "\n";
  // The record only words a refusal: a failed write leaves the lock held and the run unharmed.
  const bool recorded = ::ftruncate(fd, 0) == 0 &&
                        ::pwrite(fd, record.data(), record.size(), 0) == ssize_t(record.size());
  (void)recorded;
  return fd;
}

// The folders this project writes into D: step_NNNNNNNN and .tmp_step_NNNNNNNN (8 digits,
// is_step_folder_name), real folders, not links, sorted by name; each only with the project's
// mark (holds_project_mark; an unfinished .tmp_step_ folder's is its writing mark). A look-alike
// (step_00000004.bak, step_00000002_eval, step_results_for_paper, a step_00000003/ without
// complete.json) is the user's: never counted, pruned or cleared; a resume lists them all
// (marked_only false) to refuse a folder of broken checkpoints by name.
std::vector<fs::path> run_folders(const std::string& dir, bool marked_only = true) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    std::error_code link_ec;
    if (e.is_symlink(link_ec) || !e.is_directory(link_ec)) continue;
    if ((is_step_folder_name(name) || is_step_folder_name(name, true)) &&
        (!marked_only || holds_project_mark(e.path().string())))
      out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Rank 0, a fresh run: D must not hold another run's checkpoints, unless overwrite clears them.
void claim_fresh(const std::string& dir, bool overwrite) {
  const std::vector<fs::path> folders = run_folders(dir);
  if (folders.empty()) return;
  FSDP_CHECK(overwrite,
             "[checkpoint] {} already holds the checkpoints of a run ({} folder(s): {}{}); a new "
             "run there would mix its checkpoints with them: continue that run with --resume, "
             "clear them with --overwrite, or choose another folder",
             dir, folders.size(), folders.front().filename().string(),
             folders.size() > 1 ? " ... " + folders.back().filename().string() : "");
  for (const fs::path& p : folders) {
    std::error_code ec;
    fs::remove_all(p, ec);
    FSDP_CHECK(!ec, "[checkpoint] --overwrite: cannot remove '{}': {}", p.string(), ec.message());
  }
  fmt::print("checkpoint: --overwrite: removed {} checkpoint folder(s) from {}\n", folders.size(),
             dir);
}

// Why `dir` is a checkpoint folder of some run ("" when it is not): a step folder with the
// project's mark, a folder holding such step folders, or one holding a lock file with a holder's
// record (take_lock's "pid N on host H ...").
std::string checkpoint_folder_sign(const fs::path& dir) {
  const std::string name = dir.filename().string();
  if ((is_step_folder_name(name) || is_step_folder_name(name, true)) &&
      holds_project_mark(dir.string()))
    return "it is a checkpoint's step folder";
  std::error_code ec;
  if (fs::is_regular_file(fs::symlink_status(dir / ".lock", ec))) {
    std::ifstream f(dir / ".lock");
    char head[4] = {};
    f.read(head, 4);
    if (f.gcount() == 4 && std::string(head, 4) == "pid ")
      return "it holds a run's lock file, .lock";
  }
  if (fs::is_directory(fs::symlink_status(dir, ec))) {
    const std::vector<fs::path> held = run_folders(dir.string());
    if (!held.empty()) return "it holds checkpoints: " + held.front().filename().string();
  }
  return "";
}

}  // namespace

void check_folder_place(const std::string& dir) {
  std::error_code ec;
  fs::path abs = fs::absolute(dir, ec);
  if (!ec) abs = fs::weakly_canonical(abs, ec);
  FSDP_CHECK(!ec, "[checkpoint] cannot resolve the checkpoint folder '{}': {}", dir, ec.message());
  abs = abs.lexically_normal();
  while (!abs.has_filename() && abs.has_relative_path()) abs = abs.parent_path();  // "D/"
  FSDP_CHECK(abs != abs.root_path(),
             "[checkpoint] the checkpoint folder '{}' is the root folder '/': a run writes .lock "
             "and step_* folders there, and --overwrite and --keep remove folders there; choose "
             "a folder of the run's own",
             dir);
  // The root itself is not asked: it is refused as a checkpoint folder above.
  for (fs::path a = abs.parent_path(); !a.empty() && a != a.root_path(); a = a.parent_path()) {
    if (const std::string why = checkpoint_folder_sign(a); !why.empty())
      FSDP_FAIL(
          "[checkpoint] the checkpoint folder '{}' lies inside '{}', another run's checkpoint "
          "folder ({}): that run's --keep and --overwrite would remove this run's checkpoints; "
          "choose a folder outside it",
          dir, a.string(), why);
  }
}

void keep_latest(const std::string& dir, int keep) {
  if (keep <= 0) return;
  std::error_code ec;
  std::vector<fs::path> steps;  // step_* folders, oldest first (the names sort as the steps)
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (std::error_code dir_ec; !it->is_symlink(dir_ec) && it->is_directory(dir_ec) &&
                                is_step_folder_name(it->path().filename().string()) &&
                                holds_project_mark(it->path().string()))
      steps.push_back(it->path());
  if (ec) {
    std::fprintf(stderr, "checkpoint: cannot list %s to remove old checkpoints (%s); kept them\n",
                 dir.c_str(), ec.message().c_str());
    return;
  }
  std::sort(steps.begin(), steps.end());
  std::vector<bool> complete(steps.size());
  for (size_t i = 0; i < steps.size(); ++i)
    complete[i] = incomplete_reason(steps[i].string()).empty();
  // The oldest kept: the keep-th complete folder from the newest (none to prune with fewer).
  size_t kept = 0, oldest_kept = steps.size();
  for (size_t i = steps.size(); i-- > 0 && kept < size_t(keep);)
    if (complete[i]) ++kept, oldest_kept = i;
  if (kept < size_t(keep)) return;
  for (size_t i = 0; i < oldest_kept; ++i) {
    fs::remove_all(steps[i], ec);
    if (ec)
      std::fprintf(stderr, "checkpoint: cannot remove the old checkpoint %s (%s); left it\n",
                   steps[i].c_str(), ec.message().c_str());
  }
}

// The low-level save with the retention a Manager applies (checkpoint.h), for callers without one.
void save(const std::string& dir, int64_t step, FSDPModule& root, const optim::Optimizer& opt,
          const std::string& config_json, int keep,
          const std::shared_ptr<dist::ProcessGroup>& world, const Extras& extras) {
  save(dir, step, root, opt, config_json, world, extras,
       [keep](const std::string& d) { keep_latest(d, keep); });
}

struct Manager::Impl {
  int lock_fd = -1;
  std::unique_ptr<AsyncSaver> saver;
  ~Impl() {
    saver.reset();  // the writer is joined while the folder is still ours
    if (lock_fd >= 0) ::close(lock_fd);
  }
};

Manager::Manager(ManagerOptions options, std::shared_ptr<dist::ProcessGroup> world)
    : o_(std::move(options)), world_(std::move(world)), impl_(std::make_unique<Impl>()) {
  FSDP_CHECK(!o_.dir.empty(), "[checkpoint] the Manager needs a checkpoint folder");
  FSDP_CHECK(!(o_.resume && o_.overwrite),
             "[checkpoint] resume continues the run in {} and overwrite clears it: choose one",
             o_.dir);
  FSDP_CHECK(o_.keep >= 0, "[checkpoint] keep must be >= 0, got {}", o_.keep);
  std::string error;
  if (rank_of(world_) == 0) {
    try {
      check_folder_place(o_.dir);
      impl_->lock_fd = take_lock(o_.dir);
      if (!o_.resume) claim_fresh(o_.dir, o_.overwrite);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  FSDP_CHECK(agree(error, world_) == 0,
             "[checkpoint] rank 0 refused the checkpoint folder {} (its error says why)", o_.dir);
  run_id_ = new_run_id(world_);  // a resume replaces it with the checkpoint's
}

Manager::~Manager() = default;

std::string Manager::resume_path() const {
  const std::string path = latest(o_.dir);
  const std::string newest = path.empty() ? "" : fs::path(path).filename().string();
  // The step_* folders after the newest complete one, with why each is not complete, and the
  // .tmp_step_* ones after it (unfinished writes).
  std::vector<std::pair<fs::path, std::string>> newer;
  std::vector<fs::path> unfinished;
  for (const fs::path& p : run_folders(o_.dir, /*marked_only=*/false)) {
    const std::string name = p.filename().string();
    if (name.rfind(".tmp_", 0) == 0) {
      if (name.substr(5) > newest) unfinished.push_back(p);
    } else if (name > newest) {
      newer.emplace_back(p, incomplete_reason(p.string()));
    }
  }
  if (path.empty()) {
    FSDP_CHECK(newer.empty(),
               "[checkpoint] resume: {} holds {} checkpoint folder(s) but none is complete ({}: "
               "{}); refusing to start over them at step 0: remove them or choose another folder",
               o_.dir, newer.size(), newer.empty() ? "" : newer.front().first.string(),
               newer.empty() ? "" : newer.front().second);
    return "";
  }
  if (rank_of(world_) == 0) {
    for (const auto& [p, why] : newer)
      fmt::print(stderr, "resume: skipping {}: {}\n", p.string(), why);
    for (const fs::path& p : unfinished)
      fmt::print(stderr, "resume: skipping {}: an unfinished write\n", p.string());
  }
  return path;
}

std::optional<Loaded> Manager::load(FSDPModule& root, optim::Optimizer& opt,
                                    const std::string& config_json,
                                    const std::vector<std::string>& model_keys) {
  if (!o_.resume) return std::nullopt;
  std::string path, error;
  Loaded loaded;
  try {
    path = resume_path();
    if (!path.empty()) loaded = checkpoint::load(path, root, opt, config_json, model_keys);
  } catch (const std::exception& e) {
    error = e.what();
  }
  const int64_t failed = agree(error, world_);
  FSDP_CHECK(failed == 0,
             "[checkpoint] resume: {} other rank(s) could not load {} (their errors name the "
             "problem)",
             failed, path.empty() ? o_.dir : path);
  if (path.empty()) {
    if (rank_of(world_) == 0)
      fmt::print("resume: no checkpoint in {} yet; starting at step 0\n", o_.dir);
    return std::nullopt;
  }
  loaded_path_ = path;
  if (!loaded.run_id.empty()) run_id_ = loaded.run_id;  // format 1 named none: a new id goes on
  return loaded;
}

std::optional<Loaded> Manager::load(const RunState& run) {
  check_parts(run);
  std::optional<Loaded> loaded;
  std::string error;
  try {
    loaded = load(run.model, run.optimizer, run.config_json, run.model_keys);
    if (loaded) restore_parts(run, *loaded, loaded_path_);
  } catch (const std::exception& e) {
    error = e.what();
  }
  // The model's load was agreed above; a part's refusal is every rank's too.
  const int64_t failed = agree(error, world_);
  FSDP_CHECK(failed == 0, "[checkpoint] resume: {} other rank(s) could not restore {}'s parts",
             failed, loaded_path_);
  return loaded;
}

void Manager::save(int64_t step, const RunState& run, const Extras& extras) {
  check_parts(run);
  Extras e = extras;
  e.user_json = with_parts(run, extras.user_json);
  save(step, run.model, run.optimizer, run.config_json, e);
}

void Manager::save(int64_t step, FSDPModule& root, const optim::Optimizer& opt,
                   const std::string& config_json, const Extras& extras) {
  Extras e = extras;
  if (e.run_id.empty()) e.run_id = run_id_;
  // Rank 0, once this save is committed: now for a synchronous one, at wait() (or the next
  // save) for a background one.
  OnCommit retention = [keep = o_.keep](const std::string& dir) { keep_latest(dir, keep); };
  if (!o_.async) {
    checkpoint::save(o_.dir, step, root, opt, config_json, world_, e, retention);
    return;
  }
  if (!impl_->saver) impl_->saver = std::make_unique<AsyncSaver>();
  impl_->saver->save(o_.dir, step, root, opt, config_json, world_, e, std::move(retention));
}

int Manager::write_state() const { return impl_->saver ? int(impl_->saver->state()) : 0; }
int64_t Manager::pending_step() const { return impl_->saver ? impl_->saver->pending_step() : -1; }
void Manager::wait() {
  if (impl_->saver) impl_->saver->wait();
}
double Manager::last_blocking_seconds() const {
  return impl_->saver ? impl_->saver->last_blocking_seconds() : 0.0;
}

}  // namespace fsdp::checkpoint
