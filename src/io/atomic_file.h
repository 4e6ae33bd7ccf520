// Atomic outputs: a file or a directory appears at its final path complete or not at all.
//
//   AtomicFile f("out.safetensors");   // writes ".out.safetensors.tmp.XXXXXX" beside it
//   f.write(bytes.data(), bytes.size());
//   f.commit();                         // fsync, rename over the target, fsync the directory
//   // destroyed without commit() (an exception), or SIGINT/SIGTERM/SIGHUP before it: the
//   // temp file is removed.
//
//   AtomicDir d("ckpt/");               // creates ".ckpt.tmp.XXXXXX" beside it
//   write_file_atomic(d.path() + "/config.json", ...);
//   d.commit();                         // fsync the files, rename to "ckpt" (an existing
//                                       // target is replaced only with overwrite = true)
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace scalesweep::io {

class AtomicFile {
 public:
  explicit AtomicFile(std::string path);  // throws IoError (e.g. directory missing)
  ~AtomicFile();                          // removes the temp file unless committed
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  void write(const void* data, size_t n);  // throws IoError (disk full, ...)
  void commit();
  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return tmp_; }

 private:
  std::string path_, tmp_;
  int fd_ = -1;
  int slot_ = -1;  // entry in the table the SIGINT/SIGTERM/SIGHUP cleanup removes
  bool committed_ = false;
};

void write_file_atomic(const std::string& path, std::span<const uint8_t> bytes);
void write_file_atomic(const std::string& path, std::string_view text);

class AtomicDir {
 public:
  explicit AtomicDir(std::string path, bool overwrite = false);  // throws IoError
  ~AtomicDir();  // removes the temp directory (recursively) unless committed
  AtomicDir(const AtomicDir&) = delete;
  AtomicDir& operator=(const AtomicDir&) = delete;
  // The temporary directory to fill.
  const std::string& path() const { return tmp_; }
  const std::string& final_path() const { return path_; }
  void commit();

 private:
  std::string path_, tmp_;
  int slot_ = -1;  // entry in the table the SIGINT/SIGTERM/SIGHUP cleanup removes
  bool overwrite_, committed_ = false;
};

}  // namespace scalesweep::io
