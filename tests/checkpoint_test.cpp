// checkpoint::Manager on a world of one: the folder's lock names its holder and is released with
// the Manager, a fresh run into a folder that holds checkpoints is refused unless overwrite
// clears them (only step_* and .tmp_step_*), and a resume skips a newer incomplete checkpoint,
// loads the newest complete one and keeps the run's id. The shell tests (reliability_test,
// custom_trainer_test) hold the same rules across processes and ranks.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <system_error>

#include "fsdp/checkpoint/manager.h"
#include "fsdp/core/error.h"
#include "fsdp/dist/device_mesh.h"
#include "fsdp/dist/init.h"
#include "fsdp/fsdp/fully_shard.h"
#include "fsdp/nn/minillm.h"
#include "fsdp/optim/adamw.h"

using namespace fsdp;
namespace fs = std::filesystem;

namespace {

// A fresh folder under the system's temporary one, removed at the end of the test.
struct TempDir {
  fs::path path;
  TempDir() {
    std::string t = (fs::temp_directory_path() / "checkpoint_test_XXXXXX").string();
    path = ::mkdtemp(t.data());
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string str(const std::string& sub = "ck") const { return (path / sub).string(); }
};

// The message of what `f` throws as an fsdp::Error ("" when it does not throw).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A tiny sharded model and its optimizer, saved and loaded through a Manager.
struct TinyRun {
  std::shared_ptr<dist::ProcessGroup> world = dist::init_process_group();
  nn::MiniLLM model{[] {
    nn::MiniLLMConfig c = nn::MiniLLMConfig::preset("tiny");
    c.arch = nn::Arch::llama, c.vocab = 32, c.dim = 16, c.layers = 1, c.heads = 2, c.seq = 8;
    return c;
  }()};
  FSDPModule& root = fully_shard(model, dist::init_device_mesh({1}), {.seed = 3});
  optim::AdamW opt{root.param_groups(0.0), {.lr = 1e-3}};
  std::string config = model.config().to_json();
  ~TinyRun() { dist::destroy_process_group(); }
};

}  // namespace

TEST(Manager, LockRefusesASecondJobByNameAndIsReleasedWithTheManager) {
  TempDir t;
  auto first =
      std::make_unique<checkpoint::Manager>(checkpoint::ManagerOptions{.dir = t.str()}, nullptr);
  const std::string err =
      error_of([&] { checkpoint::Manager second({.dir = t.str(), .resume = true}, nullptr); });
  EXPECT_NE(err.find("is in use by another job (pid " + std::to_string(::getpid()) + " on host "),
            std::string::npos)
      << err;
  EXPECT_NE(err.find(t.str() + "/.lock"), std::string::npos) << err;
  first.reset();
  EXPECT_EQ(error_of([&] { checkpoint::Manager again({.dir = t.str(), .resume = true}, nullptr); }),
            "");
}

TEST(Manager, FreshRunIntoAnOccupiedFolderIsRefusedUnlessOverwrite) {
  TempDir t;
  const fs::path d = t.str();
  fs::create_directories(d / "step_00000002");
  fs::create_directories(d / ".tmp_step_00000004");
  fs::create_directories(d / "notes");
  std::ofstream(d / "README.txt") << "not ours\n";
  const std::string err = error_of([&] { checkpoint::Manager m({.dir = d.string()}, nullptr); });
  EXPECT_NE(err.find("already holds the checkpoints of a run (2 folder(s): .tmp_step_00000004 ... "
                     "step_00000002)"),
            std::string::npos)
      << err;
  EXPECT_TRUE(fs::exists(d / "step_00000002"));  // refused: nothing removed
  EXPECT_NE(error_of([&] {
              checkpoint::Manager m({.dir = d.string(), .resume = true, .overwrite = true},
                                    nullptr);
            }).find("choose one"),
            std::string::npos);
  checkpoint::Manager m({.dir = d.string(), .overwrite = true}, nullptr);
  EXPECT_FALSE(fs::exists(d / "step_00000002"));
  EXPECT_FALSE(fs::exists(d / ".tmp_step_00000004"));
  EXPECT_TRUE(fs::exists(d / "notes"));  // only the folders this project writes are cleared
  EXPECT_TRUE(fs::exists(d / "README.txt"));
}

TEST(Manager, ResumeSkipsANewerIncompleteCheckpointAndLoadsTheNewestComplete) {
  TempDir t;
  TinyRun run;
  std::string run_id;
  {
    checkpoint::Manager m({.dir = t.str(), .keep = 2}, run.world);
    EXPECT_EQ(m.resume_path(), "");
    run_id = m.run_id();
    EXPECT_FALSE(run_id.empty());
    for (int64_t step : {1, 2, 3}) {
      run.opt.set_step_count(step);
      m.save(step, run.root, run.opt, run.config, {.data_position = 10 * step});
    }
  }
  EXPECT_FALSE(fs::exists(t.path / "ck/step_00000001"));  // keep 2
  fs::create_directories(t.path / "ck/step_00000009");    // newer, unfinished
  fs::create_directories(t.path / "ck/.tmp_step_00000010");
  checkpoint::Manager m({.dir = t.str(), .resume = true}, run.world);
  EXPECT_EQ(m.resume_path(), t.str() + "/step_00000003");
  const auto loaded = m.load(run.root, run.opt, run.config, {"arch", "dim"});
  ASSERT_TRUE(loaded.has_value());
  EXPECT_EQ(loaded->step, 3);
  EXPECT_EQ(loaded->data_position, 30);
  EXPECT_EQ(m.loaded_path(), t.str() + "/step_00000003");
  EXPECT_EQ(loaded->run_id, run_id);  // the run's lineage: a resume keeps its id
  EXPECT_EQ(m.run_id(), run_id);
  EXPECT_TRUE(fs::exists(t.path / "ck/step_00000009"));  // skipped, never removed
}

TEST(Manager, ResumeRefusesStepFoldersOfWhichNoneIsComplete) {
  TempDir t;
  fs::create_directories(t.path / "ck/step_00000004");
  checkpoint::Manager m({.dir = t.str(), .resume = true}, nullptr);
  EXPECT_NE(error_of([&] { (void)m.resume_path(); }).find("none is complete"), std::string::npos);
}
