#include "io/atomic_file.h"

#include <dirent.h>
#include <fcntl.h>
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
#include <mutex>
#include <vector>

#include "scalesweep/io/safetensors.h"  // IoError

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

extern "C" void remove_temps_and_reraise(int sig) {
  const int saved = errno;
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

}  // namespace

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
  std::string templ = (dir == "/" ? "" : dir) + "/." + base + ".tmp.XXXXXX";
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
  struct stat st {};
  if (!overwrite_ && ::stat(path_.c_str(), &st) == 0) {
    throw IoError(path_ + ": already exists (refusing to overwrite)");
  }
  std::string templ = (dir == "/" ? "" : dir) + "/." + base + ".tmp.XXXXXX";
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
