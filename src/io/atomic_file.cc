#include "io/atomic_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <mutex>
#include <vector>

#include "scalesweep/base/bytes.h"
#include "scalesweep/io/file.h"  // IoError

namespace scalesweep::io {
namespace {

std::string errno_str() { return std::strerror(errno); }

// Splits "a/b/c.x" into ("a/b", "c.x"); a trailing '/' is ignored.
void split_path(std::string path, std::string* dir, std::string* base) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) {
    dir->assign(1, '.');
    *base = path;
  } else {
    if (slash == 0) {
      dir->assign(1, '/');
    } else {
      dir->assign(path, 0, slash);
    }
    *base = path.substr(slash + 1);
  }
}

void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;  // best effort: some filesystems refuse
  (void)::fsync(fd);
  ::close(fd);
}

// fsyncs every regular file under dir, and the directories themselves.
void fsync_tree(const std::string& dir) {
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(dir, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    if (it->is_regular_file(ec)) {
      const int fd = ::open(it->path().c_str(), O_RDONLY | O_CLOEXEC);
      if (fd >= 0) {
        (void)::fsync(fd);
        ::close(fd);
      }
    } else if (it->is_directory(ec)) {
      fsync_dir(it->path());
    }
  }
  fsync_dir(dir);
}

// ---- removal of unfinished temp outputs on SIGINT / SIGTERM / SIGHUP
//
// Destructors only run on exceptions; a signal's default action ends the process at once and
// left ".out.tmp.XXXXXX" (a whole checkpoint's shards) behind. Live temp paths are kept in a
// fixed table; the handler removes them with async-signal-safe calls only, then re-raises the
// signal with its default action (the exit status still says "killed by SIGINT"). Handlers are
// installed only over SIG_DFL: an ignored signal (nohup, a background job) or a host's own
// handler (the Python interpreter's SIGINT) is left alone.
constexpr int kTempSlots = 64;
constexpr size_t kTempPathMax = 4096;
struct TempSlot {
  std::atomic<int> state{0};  // 0 free, 1 being filled, 2 live file, 3 live directory
  char path[kTempPathMax];
};
TempSlot g_temp[kTempSlots];

// Removes the tree at `fd` (an open directory) with getdents64/unlinkat: no allocation, no
// locks. Depth-limited (our temp directories are flat).
void remove_dir_contents(int fd, int depth) {
  alignas(8) char buf[4096];
  for (;;) {
    const long n = ::syscall(SYS_getdents64, fd, buf, sizeof buf);
    if (n <= 0) return;
    for (long off = 0; off < n;) {
      const auto* d = reinterpret_cast<const struct dirent64*>(buf + off);
      off += d->d_reclen;
      const char* name = d->d_name;
      if (name[0] == '.' && (name[1] == 0 || (name[1] == '.' && name[2] == 0))) continue;
      if (::unlinkat(fd, name, 0) == 0) continue;
      if (depth < 8) {
        const int sub = ::openat(fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (sub >= 0) {
          remove_dir_contents(sub, depth + 1);
          ::close(sub);
        }
      }
      (void)::unlinkat(fd, name, AT_REMOVEDIR);
    }
  }
}

// Async-signal-safe: removes every live temp output.
void remove_live_temps() {
  for (TempSlot& t : g_temp) {
    const int st = t.state.load(std::memory_order_acquire);
    if (st == 2) {
      (void)::unlink(t.path);
    } else if (st == 3) {
      const int fd = ::open(t.path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (fd >= 0) {
        remove_dir_contents(fd, 0);
        ::close(fd);
      }
      (void)::rmdir(t.path);
    }
  }
}

extern "C" void remove_temps_and_reraise(int sig) {
  const int saved = errno;
  remove_live_temps();
  errno = saved;
  ::signal(sig, SIG_DFL);
  ::raise(sig);  // delivered with the default action once this handler returns
}

void install_temp_handlers() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (const int sig : {SIGINT, SIGTERM, SIGHUP}) {
      struct sigaction old {};
      if (::sigaction(sig, nullptr, &old) != 0) continue;
      if ((old.sa_flags & SA_SIGINFO) || old.sa_handler != SIG_DFL) continue;
      struct sigaction sa {};
      sa.sa_handler = remove_temps_and_reraise;
      sigemptyset(&sa.sa_mask);
      for (const int other : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&sa.sa_mask, other);
      (void)::sigaction(sig, &sa, nullptr);
    }
  });
}

// Registers a live temp path; returns its slot, or -1 (table full or path too long: best
// effort, the destructor still cleans up on exceptions).
int register_temp(const std::string& path, bool dir) {
  if (path.size() >= kTempPathMax) return -1;
  install_temp_handlers();
  for (int i = 0; i < kTempSlots; ++i) {
    int expect = 0;
    if (!g_temp[i].state.compare_exchange_strong(expect, 1, std::memory_order_acq_rel)) continue;
    std::memcpy(g_temp[i].path, path.c_str(), path.size() + 1);
    g_temp[i].state.store(dir ? 3 : 2, std::memory_order_release);
    return i;
  }
  return -1;
}

void unregister_temp(int& slot) {
  if (slot >= 0) g_temp[slot].state.store(0, std::memory_order_release);
  slot = -1;
}

// ---- SIGBUS from a mapped input truncated while being read
struct MapSlot {
  std::atomic<int> state{0};  // 0 free, 1 being filled, 2 live
  const char* begin = nullptr;
  size_t size = 0;
  char path[kTempPathMax];
};
MapSlot g_map[kTempSlots];

void write_str(const char* s) {
  size_t n = 0;
  while (s[n]) ++n;
  while (n > 0) {
    const ssize_t w = ::write(STDERR_FILENO, s, n);
    if (w <= 0) return;
    s += w;
    n -= static_cast<size_t>(w);
  }
}

extern "C" void on_sigbus(int sig, siginfo_t* info, void*) {
  const char* a = static_cast<const char*>(info->si_addr);
  for (MapSlot& m : g_map) {
    if (m.state.load(std::memory_order_acquire) != 2) continue;
    if (a < m.begin || a >= m.begin + m.size) continue;
    write_str("scalesweep: error: ");
    write_str(m.path);
    write_str(": the file changed or was truncated while being read; nothing was written\n");
    remove_live_temps();
    ::_exit(1);
  }
  // Not one of our mappings: the default action (returning re-runs the faulting access).
  ::signal(sig, SIG_DFL);
}

void install_sigbus_handler() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction old {};
    if (::sigaction(SIGBUS, nullptr, &old) != 0) return;
    if ((old.sa_flags & SA_SIGINFO) || old.sa_handler != SIG_DFL) return;
    struct sigaction sa {};
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    for (const int other : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&sa.sa_mask, other);
    (void)::sigaction(SIGBUS, &sa, nullptr);
  });
}

// ---- stale temps of killed runs
std::mutex g_note_mu;
std::function<void(const std::string&)> g_note_sink;

void note(const std::string& text) {
  std::lock_guard<std::mutex> lock(g_note_mu);
  if (g_note_sink) {
    g_note_sink(text);
  } else {
    std::fprintf(stderr, "note: %s\n", text.c_str());
    std::fflush(stderr);
  }
}

constexpr char kTempTag[] = ".tmp.";
constexpr size_t kRandomChars = 6;  // mkstemp's XXXXXX

// "." + base + ".tmp." + PID + "." + 6 chars [+ ".old"] -> PID (0 when `name` is not one).
pid_t stale_pid(const std::string& name, const std::string& base, bool* old) {
  const std::string prefix = "." + base + kTempTag;
  if (name.compare(0, prefix.size(), prefix) != 0) return 0;
  size_t i = prefix.size(), digits = 0;
  long long pid = 0;
  while (i < name.size() && name[i] >= '0' && name[i] <= '9' && digits < 10) {
    pid = pid * 10 + (name[i] - '0');
    ++i;
    ++digits;
  }
  if (digits == 0 || i >= name.size() || name[i] != '.' || pid <= 0 || pid > INT32_MAX) return 0;
  const std::string rest = name.substr(i + 1);
  if (rest.size() == kRandomChars) {
    *old = false;
  } else if (rest.size() == kRandomChars + 4 && rest.compare(kRandomChars, 4, ".old") == 0) {
    *old = true;
  } else {
    return 0;
  }
  return static_cast<pid_t>(pid);
}

bool process_gone(pid_t pid) {
  if (pid == ::getpid()) return false;
  return ::kill(pid, 0) != 0 && errno == ESRCH;
}

std::string temp_template(const std::string& dir, const std::string& base) {
  return (dir == "/" ? "" : dir) + "/." + base + kTempTag + std::to_string(::getpid()) + "." +
         std::string(kRandomChars, 'X');
}

}  // namespace

void set_atomic_note_sink(std::function<void(const std::string&)> sink) {
  std::lock_guard<std::mutex> lock(g_note_mu);
  g_note_sink = std::move(sink);
}

int clean_stale_temps(const std::string& path) {
  std::string dir, base;
  split_path(path, &dir, &base);
  if (base.empty() || base == "." || base == "..") return 0;
  std::vector<std::pair<std::string, pid_t>> temps, olds;
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator(dir, ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    bool old = false;
    const pid_t pid = stale_pid(name, base, &old);
    if (pid == 0 || !process_gone(pid)) continue;
    (old ? olds : temps).emplace_back((dir == "/" ? "" : dir) + "/" + name, pid);
  }
  int n = 0;
  std::string target = path;
  while (target.size() > 1 && target.back() == '/') target.pop_back();
  for (const auto& [p, pid] : olds) {  // first: a previous output moved aside goes back
    struct stat st {};
    if (::lstat(target.c_str(), &st) != 0 && errno == ENOENT &&
        ::rename(p.c_str(), target.c_str()) == 0) {
      note("put back the previous '" + target + "' from '" + p + "' (run " + std::to_string(pid) +
           " was killed while replacing it)");
      ++n;
      continue;
    }
    temps.emplace_back(p, pid);
  }
  for (const auto& [p, pid] : temps) {
    std::filesystem::remove_all(p, ec);
    if (ec) {
      note("cannot remove '" + p + "' left by a killed run (" + std::to_string(pid) +
           "): " + ec.message());
      continue;
    }
    note("removed '" + p + "' left unfinished by an earlier run (" + std::to_string(pid) +
         ") that was killed");
    ++n;
  }
  return n;
}

void guard_mapping(const void* data, size_t size, const std::string& file) {
  if (!data || size == 0 || file.size() >= kTempPathMax) return;
  install_sigbus_handler();
  for (MapSlot& m : g_map) {
    int expect = 0;
    if (!m.state.compare_exchange_strong(expect, 1, std::memory_order_acq_rel)) continue;
    m.begin = static_cast<const char*>(data);
    m.size = size;
    std::memcpy(m.path, file.c_str(), file.size() + 1);
    m.state.store(2, std::memory_order_release);
    return;
  }
}

void unguard_mapping(const void* data) {
  if (!data) return;
  for (MapSlot& m : g_map) {
    if (m.state.load(std::memory_order_acquire) == 2 && m.begin == data) {
      m.state.store(0, std::memory_order_release);
      return;
    }
  }
}

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  std::string dir, base;
  split_path(path_, &dir, &base);
  if (base.empty() || base == "." || base == "..") {
    throw IoError(path_ + ": not a file name");
  }
  struct stat st {};
  if (::stat(path_.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    throw IoError(path_ + ": is a directory");
  }
  clean_stale_temps(path_);
  std::string templ = temp_template(dir, base);
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  fd_ = ::mkostemp(buf.data(), O_CLOEXEC);
  if (fd_ < 0) throw IoError(path_ + ": cannot create a file in '" + dir + "': " + errno_str());
  tmp_ = buf.data();
  slot_ = register_temp(tmp_, /*dir=*/false);
  ::fchmod(
      fd_, 0644 & ~[] {
        const mode_t m = ::umask(0);
        ::umask(m);
        return m;
      }());
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_ && !tmp_.empty()) ::unlink(tmp_.c_str());
  unregister_temp(slot_);
}

void AtomicFile::write(const void* data, size_t n) {
  if (fd_ < 0) throw IoError(path_ + ": write after commit");
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw IoError(path_ + ": write failed: " + errno_str());
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void AtomicFile::commit() {
  if (committed_) return;
  if (::fsync(fd_) != 0) throw IoError(path_ + ": fsync failed: " + errno_str());
  if (::close(fd_) != 0) {
    fd_ = -1;
    throw IoError(path_ + ": close failed: " + errno_str());
  }
  fd_ = -1;
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    throw IoError(path_ + ": cannot rename the temp file into place: " + errno_str());
  }
  committed_ = true;
  unregister_temp(slot_);
  std::string dir, base;
  split_path(path_, &dir, &base);
  fsync_dir(dir);
}

void check_free_space(const std::string& path, uint64_t bytes) {
  namespace fs = std::filesystem;
  fs::path dir = fs::path(path).parent_path();
  if (dir.empty()) dir = ".";
  std::error_code ec;
  const fs::space_info sp = fs::space(dir, ec);
  if (ec || sp.available == static_cast<std::uintmax_t>(-1) || bytes <= sp.available) return;
  throw IoError(path + ": the output needs about " + format_bytes(static_cast<int64_t>(bytes)) +
                " but the file system holding " + dir.string() + " has " +
                format_bytes(static_cast<int64_t>(sp.available)) + " free; nothing was written");
}

void write_file_atomic(const std::string& path, std::span<const uint8_t> bytes) {
  AtomicFile f(path);
  f.write(bytes.data(), bytes.size());
  f.commit();
}

void write_file_atomic(const std::string& path, std::string_view text) {
  AtomicFile f(path);
  f.write(text.data(), text.size());
  f.commit();
}

AtomicDir::AtomicDir(std::string path, bool overwrite)
    : path_(std::move(path)), overwrite_(overwrite) {
  while (path_.size() > 1 && path_.back() == '/') path_.pop_back();
  std::string dir, base;
  split_path(path_, &dir, &base);
  if (base.empty() || base == "." || base == "..") throw IoError(path_ + ": not a directory name");
  clean_stale_temps(path_);
  struct stat st {};
  if (!overwrite_ && ::stat(path_.c_str(), &st) == 0) {
    throw IoError(path_ + ": already exists (refusing to overwrite)");
  }
  std::string templ = temp_template(dir, base);
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  if (::mkdtemp(buf.data()) == nullptr) {
    throw IoError(path_ + ": cannot create a directory in '" + dir + "': " + errno_str());
  }
  tmp_ = buf.data();
  slot_ = register_temp(tmp_, /*dir=*/true);
  ::chmod(
      tmp_.c_str(), 0755 & ~[] {
        const mode_t m = ::umask(0);
        ::umask(m);
        return m;
      }());
}

AtomicDir::~AtomicDir() {
  if (!committed_ && !tmp_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(tmp_, ec);
  }
  unregister_temp(slot_);
}

void AtomicDir::commit() {
  if (committed_) return;
  fsync_tree(tmp_);
  std::string dir, base;
  split_path(path_, &dir, &base);
  struct stat st {};
  if (::stat(path_.c_str(), &st) == 0) {
    if (!overwrite_) throw IoError(path_ + ": already exists (refusing to overwrite)");
    // Move the old one aside, put the new one in place, then delete the old one.
    const std::string old = tmp_ + ".old";
    if (::rename(path_.c_str(), old.c_str()) != 0) {
      throw IoError(path_ + ": cannot move the existing output aside: " + errno_str());
    }
    if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
      const std::string err = errno_str();
      (void)::rename(old.c_str(), path_.c_str());
      throw IoError(path_ + ": cannot rename the temp directory into place: " + err);
    }
    committed_ = true;
    unregister_temp(slot_);
    std::error_code ec;
    std::filesystem::remove_all(old, ec);
  } else {
    if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
      throw IoError(path_ + ": cannot rename the temp directory into place: " + errno_str());
    }
    committed_ = true;
    unregister_temp(slot_);
  }
  fsync_dir(dir);
}

}  // namespace scalesweep::io
