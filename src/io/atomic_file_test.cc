// Atomic outputs under faults: a full disk (RLIMIT_FSIZE -> EFBIG), SIGKILL mid-write (the temp
// stays; the next run removes it, or puts a moved-aside previous output back), and a mapped
// input truncated while being read (SIGBUS -> one message naming the file, exit 1).
#include "io/atomic_file.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "model/test_util.h"
#include "scalesweep/io/file.h"

namespace scalesweep::io {
namespace {

using model::testing::slurp;
using model::testing::TempDir;
namespace fs = std::filesystem;

std::vector<std::string> names_in(const std::string& dir) {
  std::vector<std::string> v;
  for (const auto& e : fs::directory_iterator(dir)) v.push_back(e.path().filename().string());
  std::sort(v.begin(), v.end());
  return v;
}

void put(const std::string& path, const std::string& text) { write_file_atomic(path, text); }

// A pid that is not running: a child that has exited and been reaped.
pid_t dead_pid() {
  const pid_t p = ::fork();
  if (p == 0) ::_exit(0);
  int st = 0;
  ::waitpid(p, &st, 0);
  return p;
}

struct NoteCapture {
  std::vector<std::string> notes;
  NoteCapture() {
    set_atomic_note_sink([this](const std::string& s) { notes.push_back(s); });
  }
  ~NoteCapture() { set_atomic_note_sink(nullptr); }
};

TEST(AtomicFile, TempNameCarriesThePid) {
  TempDir d("ss_atomic_");
  AtomicFile f(d.sub("out.bin"));
  const std::string want = d.sub(".out.bin.tmp." + std::to_string(::getpid()) + ".");
  EXPECT_EQ(f.temp_path().rfind(want, 0), 0u) << f.temp_path();
  EXPECT_EQ(f.temp_path().size(), want.size() + 6);
}

TEST(AtomicFile, DiskFullLeavesNoTempAndKeepsThePreviousOutput) {
  TempDir d("ss_atomic_");
  const std::string out = d.sub("out.bin");
  put(out, "previous");
  // In a child: RLIMIT_FSIZE with SIGXFSZ ignored makes write() fail with EFBIG.
  const pid_t p = ::fork();
  if (p == 0) {
    ::signal(SIGXFSZ, SIG_IGN);
    struct rlimit rl {
      4096, 4096
    };
    ::setrlimit(RLIMIT_FSIZE, &rl);
    try {
      AtomicFile f(out);
      const std::vector<char> big(1 << 16, 'x');
      f.write(big.data(), big.size());
      f.commit();
    } catch (const IoError& e) {
      const std::string m = e.what();
      ::_exit(m.find(out) != std::string::npos && m.find("File too large") != std::string::npos
                  ? 7
                  : 8);
    }
    ::_exit(9);
  }
  int st = 0;
  ASSERT_EQ(::waitpid(p, &st, 0), p);
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 7);
  EXPECT_EQ(slurp(out), "previous");
  EXPECT_EQ(names_in(d.p.string()), std::vector<std::string>{"out.bin"});
}

// SIGKILL between write and commit: the temp stays (no cleanup runs), the output is untouched;
// the next AtomicFile for the same path removes the temp, with a note.
TEST(AtomicFile, TempOfAKilledRunIsRemovedByTheNextRun) {
  TempDir d("ss_atomic_");
  const std::string out = d.sub("out.bin");
  put(out, "previous");
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t p = ::fork();
  if (p == 0) {
    AtomicFile f(out);
    f.write("half", 4);
    (void)!::write(fds[1], "k", 1);
    ::pause();
    ::_exit(0);
  }
  char c;
  ASSERT_EQ(::read(fds[0], &c, 1), 1);
  ::kill(p, SIGKILL);
  int st = 0;
  ::waitpid(p, &st, 0);
  ::close(fds[0]);
  ::close(fds[1]);
  const std::string stale = ".out.bin.tmp." + std::to_string(p) + ".";
  auto names = names_in(d.p.string());
  ASSERT_EQ(names.size(), 2u);
  EXPECT_EQ(names[0].rfind(stale, 0), 0u) << names[0];
  EXPECT_EQ(slurp(out), "previous");

  NoteCapture nc;
  {
    AtomicFile again(out);  // not committed: the previous content must survive this too
    again.write("x", 1);
  }
  EXPECT_EQ(names_in(d.p.string()), std::vector<std::string>{"out.bin"});
  EXPECT_EQ(slurp(out), "previous");
  ASSERT_EQ(nc.notes.size(), 1u);
  EXPECT_NE(nc.notes[0].find(names[0]), std::string::npos) << nc.notes[0];
  EXPECT_NE(nc.notes[0].find("killed"), std::string::npos) << nc.notes[0];
}

TEST(AtomicFile, TempsOfLiveProcessesAndForeignNamesStay) {
  TempDir d("ss_atomic_");
  const std::string out = d.sub("out.bin");
  const pid_t gone = dead_pid();
  const std::vector<std::string> keep = {
      ".out.bin.tmp.1.abcdef",                                    // pid 1 is alive
      ".out.bin.tmp." + std::to_string(::getppid()) + ".abcdef",  // alive
      ".out.bin.tmp.abcdef",                                      // old naming, no pid
      ".out.bin.tmp." + std::to_string(gone) + ".abc",            // not mkstemp's 6 chars
      ".other.bin.tmp." + std::to_string(gone) + ".abcdef",       // another output
  };
  for (const auto& n : keep) put(d.sub(n), "t");
  put(d.sub(".out.bin.tmp." + std::to_string(gone) + ".abcdef"), "stale");
  fs::create_directory(d.sub(".out.bin.tmp." + std::to_string(gone) + ".Zz09aB"));
  put(d.sub(".out.bin.tmp." + std::to_string(gone) + ".Zz09aB/shard"), "s");
  NoteCapture nc;
  EXPECT_EQ(clean_stale_temps(out), 2);
  EXPECT_EQ(nc.notes.size(), 2u);
  auto want = keep;
  std::sort(want.begin(), want.end());
  EXPECT_EQ(names_in(d.p.string()), want);
}

// AtomicDir::commit over an existing output moves it to "<temp>.old" first; a kill between the
// two renames leaves the output path missing: the next run puts the previous output back.
TEST(AtomicDir, PreviousOutputMovedAsideByAKilledRunIsPutBack) {
  TempDir d("ss_atomic_");
  const std::string out = d.sub("ckpt");
  const pid_t gone = dead_pid();
  const std::string tmp = d.sub(".ckpt.tmp." + std::to_string(gone) + ".AbCdEf");
  fs::create_directory(tmp);
  put(tmp + "/model.safetensors", "new, complete but never renamed");
  fs::create_directory(tmp + ".old");
  put(tmp + ".old/model.safetensors", "previous");
  NoteCapture nc;
  EXPECT_THROW(AtomicDir(out, /*overwrite=*/false), IoError);  // the previous output is back
  EXPECT_EQ(slurp(out + "/model.safetensors"), "previous");
  EXPECT_EQ(names_in(d.p.string()), std::vector<std::string>{"ckpt"});
  ASSERT_EQ(nc.notes.size(), 2u);
  EXPECT_NE(nc.notes[0].find("put back"), std::string::npos) << nc.notes[0];

  // Killed after the second rename: the output is the new one, the ".old" copy goes.
  fs::create_directory(tmp + ".old");
  put(tmp + ".old/model.safetensors", "older");
  {
    AtomicDir again(out, /*overwrite=*/true);
    EXPECT_EQ(names_in(d.p.string()).size(), 2u);  // ckpt and the new temp
  }
  EXPECT_EQ(names_in(d.p.string()), std::vector<std::string>{"ckpt"});
  EXPECT_EQ(slurp(out + "/model.safetensors"), "previous");
}

// A mapped input truncated while being read: SIGBUS becomes one message naming the file, the
// live temp outputs are removed, and the exit status is 1.
TEST(MappedFileDeathTest, TruncatedWhileMappedGivesOneMessage) {
  TempDir d("ss_atomic_");
  const std::string in = d.sub("in.bin");
  const std::string out = d.sub("out.bin");
  put(in, std::string(3 * 4096, 'a'));
  put(out, "previous");
  EXPECT_EXIT(
      {
        MappedFile m(in);
        AtomicFile f(out);
        f.write("partial", 7);
        ::truncate(in.c_str(), 0);
        volatile uint8_t sink = m.bytes()[2 * 4096];
        (void)sink;
        ::_exit(3);  // not reached
      },
      ::testing::ExitedWithCode(1),
      "error: .*in\\.bin: the file changed or was truncated while being read; nothing was "
      "written");
  EXPECT_EQ(names_in(d.p.string()), (std::vector<std::string>{"in.bin", "out.bin"}));
  EXPECT_EQ(slurp(out), "previous");
}

// A mapping no longer registered (destroyed) keeps the default action: a SIGBUS elsewhere is
// not reported as a truncated input.
TEST(MappedFileDeathTest, UnguardedFaultKeepsTheDefaultAction) {
  TempDir d("ss_atomic_");
  const std::string in = d.sub("in.bin");
  put(in, std::string(2 * 4096, 'a'));
  EXPECT_EXIT(
      {
        MappedFile m(in);
        unguard_mapping(m.bytes().data());
        ::truncate(in.c_str(), 0);
        volatile uint8_t sink = m.bytes()[4096];
        (void)sink;
        ::_exit(3);
      },
      ::testing::KilledBySignal(SIGBUS), "");
}

}  // namespace
}  // namespace scalesweep::io
