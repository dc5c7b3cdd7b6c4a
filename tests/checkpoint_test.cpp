// checkpoint::Manager on a world of one: the folder's lock names its holder and is released with
// the Manager, a fresh run into a folder that holds checkpoints is refused unless overwrite
// clears them (only step_* and .tmp_step_*), and a resume skips a newer incomplete checkpoint,
// loads the newest complete one and keeps the run's id; keep retains the newest step folders once
// each save (synchronous or in the background) is committed. The shell tests (reliability_test,
// custom_trainer_test) hold the same rules across processes and ranks. Manifest: the seal and the
// chunk checks that load and consolidate share (reliability_test 21 holds them at 2 ranks).
#include "fsdp/checkpoint/checkpoint.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include "fsdp/checkpoint/interchange.h"
#include "fsdp/checkpoint/manager.h"
#include "fsdp/checkpoint/safetensors.h"
#include "fsdp/core/error.h"
#include "fsdp/core/stateful.h"
#include "fsdp/data/loader.h"
#include "fsdp/data/token_sources.h"
#include "fsdp/distributed/device_mesh.h"
#include "fsdp/distributed/init.h"
#include "fsdp/fsdp/fully_shard.h"
#include "fsdp/nn/transformer.h"
#include "fsdp/optim/adamw.h"
#include "test_util.h"

using namespace fsdp;
namespace fs = std::filesystem;

namespace {

// A checkpoint_test_XXXXXX folder, removed at the end of the test.
struct TempDir : test::TempDir {
  TempDir() : test::TempDir("checkpoint_test") {}
};
using test::error_of;

// A tiny sharded model and its optimizer, saved and loaded through a Manager.
struct TinyRun {
  std::shared_ptr<dist::ProcessGroup> world = dist::init_process_group();
  nn::Transformer model{[] {
    nn::TransformerConfig c = nn::TransformerConfig::preset("tiny");
    c.arch = nn::Arch::decoder, c.vocab = 32, c.dim = 16, c.layers = 1, c.heads = 2, c.seq = 8;
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

// A step folder of this project's whose seal is missing (a damaged checkpoint, still ours).
void unsealed_step_folder(const fs::path& p) {
  fs::create_directories(p);
  std::ofstream(p / "metadata.json") << "{\"format\": \"fsdp.cpp-checkpoint/2\"}\n";
}

TEST(Manager, FreshRunIntoAnOccupiedFolderIsRefusedUnlessOverwrite) {
  TempDir t;
  const fs::path d = t.str();
  unsealed_step_folder(d / "step_00000002");
  fs::create_directories(d / "step_00000003");  // the right name, without the mark: the user's
  std::ofstream(d / "step_00000003/notes.txt") << "mine\n";
  fs::create_directories(d / ".tmp_step_00000004");  // an unfinished write: the writing mark
  std::ofstream(d / ".tmp_step_00000004/.fsdp_checkpoint_writing") << "\n";
  fs::create_directories(d / ".tmp_step_00000005");  // the name alone, no mark: the user's
  std::ofstream(d / ".tmp_step_00000005/notes.txt") << "mine\n";
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
  EXPECT_TRUE(fs::exists(d / "step_00000003/notes.txt"));
  EXPECT_TRUE(fs::exists(d / ".tmp_step_00000005/notes.txt"));
  EXPECT_TRUE(fs::exists(d / "README.txt"));
}

// A folder inside another run's checkpoint folder (its step folder, a folder holding its lock or
// its step folders) and the root folder are refused by name before anything is written there: the
// other run's keep and overwrite would remove this one's checkpoints.
TEST(Manager, AFolderInsideAnotherRunsFolderOrTheRootIsRefused) {
  TempDir t;
  const fs::path d = t.str();
  { checkpoint::Manager locked({.dir = d.string()}, nullptr); }  // leaves D/.lock and its record
  std::string err =
      error_of([&] { checkpoint::Manager m({.dir = (d / "sub").string()}, nullptr); });
  EXPECT_NE(err.find("lies inside '" + d.string() +
                     "', another run's checkpoint folder (it holds "
                     "a run's lock file, .lock)"),
            std::string::npos)
      << err;
  EXPECT_FALSE(fs::exists(d / "sub"));
  unsealed_step_folder(t.path / "other/step_00000002");
  err = error_of([&] {
    checkpoint::Manager m({.dir = (t.path / "other/step_00000002/x/y").string()}, nullptr);
  });
  EXPECT_NE(err.find("lies inside '" + (t.path / "other/step_00000002").string() +
                     "', another run's checkpoint folder (it is a checkpoint's step folder)"),
            std::string::npos)
      << err;
  err =
      error_of([&] { checkpoint::Manager m({.dir = (t.path / "other/mine").string()}, nullptr); });
  EXPECT_NE(err.find("(it holds checkpoints: step_00000002)"), std::string::npos) << err;
  EXPECT_NE(error_of([] { checkpoint::check_folder_place("/"); }).find("is the root folder '/'"),
            std::string::npos);
  // A look-alike beside a folder is the user's: it makes no checkpoint folder of its parent.
  fs::create_directories(t.path / "plain/step_00000001");
  EXPECT_EQ(error_of([&] { checkpoint::check_folder_place((t.path / "plain/run").string()); }), "");
  // D itself may hold its lock and checkpoints (a resume), with or without a trailing '/'.
  EXPECT_EQ(error_of([&] { checkpoint::check_folder_place(d.string() + "/"); }), "");
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

namespace {

// A trainer's own state: a counter and a label.
struct Counter : Stateful {
  int64_t n = 0;
  std::string label;
  std::string state_dict() const override {
    return nlohmann::json{{"n", n}, {"label", label}}.dump();
  }
  void load_state_dict(const std::string& state, const std::string& where) override {
    const nlohmann::json j = nlohmann::json::parse(state);
    FSDP_CHECK(j.contains("n"), "{}: no n", where);
    n = j["n"].get<int64_t>();
    label = j["label"].get<std::string>();
  }
};

}  // namespace

// A RunState's parts: each saved under its name in metadata.json's "user" object (the loader's
// state in fsdp-train's format, {"tokens", "windows"}) and restored on resume into fresh objects;
// a required part the checkpoint lacks, a part's value it refuses, two parts of one name and a
// part named like a key of the extras' user JSON are refused by name; an optional part the
// checkpoint lacks is left as it was.
TEST(Manager, RunStatePartsAreSavedByNameAndRestoredOnResume) {
  TempDir t;
  TinyRun run;
  auto source = std::make_shared<data::RandomTokenSource>(32, 1);
  data::DataLoader loader(source, 4, 0, 1, 8);
  (void)loader.next(), (void)loader.next();  // 8 windows read
  Counter counter;
  counter.n = 41, counter.label = "warm";
  {
    checkpoint::Manager m({.dir = t.str()}, run.world);
    const checkpoint::RunState state{
        run.root, run.opt, run.config, {"arch"}, {{"data", &loader}, {"counter", &counter}}};
    m.save(5, state, {.user_json = R"({"note": "mine"})"});
    EXPECT_NE(error_of([&] {
                m.save(6, state, {.user_json = R"({"data": 1})"});
              }).find("the extras' user JSON has a key 'data', the name of a part"),
              std::string::npos);
    const checkpoint::RunState twice{
        run.root, run.opt, run.config, {}, {{"a", &counter}, {"a", &loader}}};
    EXPECT_NE(error_of([&] { m.save(6, twice); }).find("names two parts 'a'"), std::string::npos);
  }
  std::ifstream meta(t.path / "ck/step_00000005/metadata.json");
  const nlohmann::json user = nlohmann::json::parse(meta).at("user");
  EXPECT_EQ(
      user.dump(),
      R"({"counter":{"label":"warm","n":41},"data":{"tokens":64,"windows":8},"note":"mine"})");

  data::DataLoader fresh(source, 4, 0, 1, 8);
  Counter restored, untouched;
  untouched.n = 7;
  checkpoint::Manager m({.dir = t.str(), .resume = true}, run.world);
  const auto loaded =
      m.load({run.root,
              run.opt,
              run.config,
              {"arch"},
              {{"data", &fresh}, {"counter", &restored}, {"later", &untouched, false}}});
  ASSERT_TRUE(loaded.has_value());
  EXPECT_EQ(loaded->step, 5);
  EXPECT_EQ(fresh.position(), 8);
  EXPECT_EQ(restored.n, 41);
  EXPECT_EQ(restored.label, "warm");
  EXPECT_EQ(untouched.n, 7);  // optional, not in the checkpoint: left as it was

  const std::string missing = error_of([&] {
    (void)m.load({run.root, run.opt, run.config, {}, {{"schedule", &restored}}});
  });
  EXPECT_NE(missing.find("step_00000005/metadata.json: user holds no state of the run's part "
                         "'schedule' (it holds: counter, data, note)"),
            std::string::npos)
      << missing;
  // A loader's state that is not one: named by file and field.
  const std::string refused = error_of([&] {
    (void)m.load({run.root, run.opt, run.config, {}, {{"counter", &fresh}}});
  });
  EXPECT_NE(refused.find("step_00000005/metadata.json: user.counter"), std::string::npos)
      << refused;
  EXPECT_NE(refused.find("is not a data loader's state"), std::string::npos) << refused;
}

namespace {

// D's entries but the lock, sorted by name and joined by spaces.
std::string listing(const fs::path& d) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(d))
    if (e.path().filename() != ".lock") names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : " ") + n;
  return out;
}

}  // namespace

// Retention is the Manager's: once each save is committed, rank 0 keeps the newest 2 complete
// step_* folders, removes those before them (an old incomplete one goes once 2 complete ones are
// newer), and never touches a .tmp_step_* folder.
TEST(Manager, KeepRetainsTheNewestCheckpointsOnceEachSaveIsCommitted) {
  TempDir t;
  TinyRun run;
  const fs::path d = t.str();
  unsealed_step_folder(d / "step_00000000");         // incomplete, older than the run's saves
  fs::create_directories(d / ".tmp_step_00000009");  // an unfinished write of another attempt
  checkpoint::Manager m({.dir = d.string(), .resume = true, .keep = 2}, run.world);
  const std::pair<int64_t, std::string> want[] = {
      {1, ".tmp_step_00000009 step_00000000 step_00000001"},
      {2, ".tmp_step_00000009 step_00000001 step_00000002"},
      {3, ".tmp_step_00000009 step_00000002 step_00000003"},
      {4, ".tmp_step_00000009 step_00000003 step_00000004"}};
  for (const auto& [step, folders] : want) {
    m.save(step, run.root, run.opt, run.config);
    EXPECT_EQ(listing(d), folders) << "after the save of step " << step;
  }
  EXPECT_EQ(checkpoint::latest(d.string()), (d / "step_00000004").string());
}

// A newer incomplete folder (a crashed attempt at step 9 that the resume skipped) does not count:
// with keep 1 the checkpoint just written stays (it was removed at once when folders counted by
// name), the older complete one goes, and the incomplete one is left for its owner.
TEST(Manager, KeepNeverRemovesTheCheckpointJustWrittenForANewerIncompleteOne) {
  TempDir t;
  TinyRun run;
  const fs::path d = t.str();
  {
    checkpoint::Manager first({.dir = d.string()}, run.world);
    first.save(4, run.root, run.opt, run.config);
  }
  fs::create_directories(d / "step_00000009");  // no metadata.json, no seal
  checkpoint::Manager m({.dir = d.string(), .resume = true, .keep = 1}, run.world);
  m.save(5, run.root, run.opt, run.config);
  EXPECT_EQ(listing(d), "step_00000005 step_00000009");
  EXPECT_EQ(checkpoint::latest(d.string()), (d / "step_00000005").string());
}

// A background save is pruned for when it is committed (the next save, or wait()): the folder
// being written (.tmp_step_N) is neither counted nor removed.
TEST(Manager, KeepPrunesABackgroundSaveWhenItIsCommitted) {
  TempDir t;
  TinyRun run;
  const fs::path d = t.str();
  checkpoint::Manager m({.dir = d.string(), .keep = 2, .async = true}, run.world);
  const std::pair<int64_t, std::string> want[] = {
      {1, ".tmp_step_00000001"},
      {2, ".tmp_step_00000002 step_00000001"},
      {3, ".tmp_step_00000003 step_00000001 step_00000002"},
      {4, ".tmp_step_00000004 step_00000002 step_00000003"}};
  for (const auto& [step, folders] : want) {
    m.save(step, run.root, run.opt, run.config);
    EXPECT_EQ(m.pending_step(), step);
    EXPECT_EQ(listing(d), folders) << "after the save of step " << step;
  }
  m.wait();
  EXPECT_EQ(m.pending_step(), -1);
  EXPECT_EQ(listing(d), "step_00000003 step_00000004");
}

// The low-level save: the protocol alone keeps every checkpoint; its keep form applies the
// Manager's retention, for callers without one.
TEST(Retention, LowLevelSaveKeepsAllOrTheNewestKeep) {
  TempDir t;
  TinyRun run;
  for (int64_t step : {1, 2, 3})
    checkpoint::save(t.str(), step, run.root, run.opt, run.config, run.world);
  EXPECT_EQ(listing(t.str()), "step_00000001 step_00000002 step_00000003");
  checkpoint::save(t.str(), 4, run.root, run.opt, run.config, 2, run.world);
  EXPECT_EQ(listing(t.str()), "step_00000003 step_00000004");
  checkpoint::save(t.str(), 5, run.root, run.opt, run.config, 0, run.world);
  EXPECT_EQ(listing(t.str()), "step_00000003 step_00000004 step_00000005");
}

// The manifest check (src/checkpoint/manifest.h) that load and consolidate share: the seal, then
// the chunks' coverage, refused in the same words by both before any tensor byte is read.
namespace {

// A checkpoint of TinyRun at step 1 whose metadata.json `edit` changes; resealed when `reseal`.
std::string tampered(TinyRun& r, const TempDir& t, const std::string& from, const std::string& to,
                     bool reseal = true) {
  checkpoint::Extras extras;
  extras.run_id = "unit";
  checkpoint::save(t.str(), 1, r.root, r.opt, r.config, r.world, extras);
  const fs::path p = fs::path(t.str()) / "step_00000001";
  std::ifstream in(p / "metadata.json");
  std::string text((std::istreambuf_iterator<char>(in)), {});
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) text.replace(at, from.size(), to);
  std::ofstream(p / "metadata.json", std::ios::trunc) << text;
  if (reseal)
    std::ofstream(p / "complete.json", std::ios::trunc)
        << "{\"metadata_checksum\": \"" << checkpoint::file_checksum((p / "metadata.json").string())
        << "\"}";
  return p.string();
}

// What load and consolidate say of `path`; the test expects both to say the same.
std::pair<std::string, std::string> refusals(TinyRun& r, const std::string& path) {
  return {error_of([&] { (void)checkpoint::load(path, r.root, r.opt, r.config, {"arch"}); }),
          error_of([&] { (void)checkpoint::consolidate(path, nullptr); })};
}

}  // namespace

TEST(Manifest, AnIntactCheckpointLoadsAndNamesItsRun) {
  TempDir t;
  TinyRun r;
  const std::string p = tampered(r, t, "\"step\"", "\"step\"");
  EXPECT_EQ(checkpoint::incomplete_reason(p), "");
  EXPECT_EQ(checkpoint::load(p, r.root, r.opt, r.config, {"arch"}).run_id, "unit");
  EXPECT_EQ(checkpoint::latest(t.str()), p);
}

TEST(Manifest, AnEditedMetadataWithoutItsSealIsIncomplete) {
  TempDir t;
  TinyRun r;
  const std::string p = tampered(r, t, "\"step\": 1", "\"step\": 2", /*reseal=*/false);
  EXPECT_NE(checkpoint::incomplete_reason(p).find("(metadata.json was changed after the "
                                                  "checkpoint was written)"),
            std::string::npos);
  EXPECT_EQ(checkpoint::latest(t.str()), "");
  const auto [load, export_] = refusals(r, p);
  EXPECT_NE(load.find("; not a complete checkpoint, so not read"), std::string::npos) << load;
  EXPECT_EQ(load, export_);
}

TEST(Manifest, ChunksThatDoNotCoverATensorExactlyAreRefusedAlikeByLoadAndExport) {
  const std::pair<std::string, std::string> cases[] = {
      {"[[-1,32]]", "tensor 'embed.weight' chunk 0 is [-1, 32]: a negative first row"},
      {"[[0,30]]",
       "tensor 'embed.weight' chunks [[0,30]] cover rows 0..30 but the tensor has 32 rows"},
      {"[[0,33]]", "tensor 'embed.weight' chunk 0 is [0, 33]: it runs past the tensor's 32 rows"},
      {"[[0,16],[16,16]]", "tensor 'embed.weight' has [[0,16],[16,16]] chunks but 'shards' is 1"}};
  for (const auto& [chunks, want] : cases) {
    TempDir t;
    TinyRun r;
    // metadata.json is written with dump(1): the embedding's chunks are the first in the file.
    const std::string p = tampered(r, t, "\"chunks\": [\n    [\n     0,\n     32\n    ]\n   ]",
                                   "\"chunks\": " + chunks);
    const auto [load, export_] = refusals(r, p);
    EXPECT_NE(load.find(want), std::string::npos) << load;
    EXPECT_EQ(load, export_);
  }
}

// A model file truncated (or rewritten shorter) while it is mapped: the page past its new end
// raised SIGBUS, a bare "Bus error" (rc 135). The guard names the file and the offset and exits 1.
TEST(MappedFileDeathTest, ATruncatedSafetensorsUnderItsReaderIsANamedErrorNotABusError) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  TempDir t;
  const std::string path = (t.path / "model.safetensors").string();
  checkpoint::save_safetensors(path, {{"w", Tensor::zeros({1 << 16}, DType::f32)}}, {});
  EXPECT_EXIT(
      {
        const checkpoint::SafetensorsFile f = checkpoint::map_safetensors(path);
        if (::truncate(path.c_str(), 4096) != 0) std::_Exit(3);
        volatile float x = f.tensors[0].second.data<float>()[60000];  // 240 KB in: past the end
        (void)x;
        std::_Exit(0);
      },
      ::testing::ExitedWithCode(1),
      "\\[safetensors\\] '.*model.safetensors' was truncated or rewritten while it was being "
      "read: offset [0-9]+ of the [0-9]+ bytes mapped, and the file now has 4096 bytes");
}

// A SIGBUS that is not a fault in a mapped file (here one sent by kill) still ends the process
// as SIGBUS: the guard hands it to the disposition that was there before.
TEST(MappedFileDeathTest, ASigbusOutsideTheMappedFilesIsNotSwallowed) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  TempDir t;
  const std::string path = (t.path / "model.safetensors").string();
  checkpoint::save_safetensors(path, {{"w", Tensor::zeros({16}, DType::f32)}}, {});
  EXPECT_EXIT(
      {
        const checkpoint::SafetensorsFile f = checkpoint::map_safetensors(path);  // the guard
        ::raise(SIGBUS);
        std::_Exit(0);
      },
      ::testing::KilledBySignal(SIGBUS), "");
}
