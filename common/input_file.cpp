#include "common/input_file.h"

#include <cerrno>
#include <cstring>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

namespace npusim {
namespace {

const char* file_type_name(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "a special file";
}

// Closes the descriptor on every return path.
struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

bool try_read_input_file(const std::string& path, std::string_view kind, uint64_t max_bytes,
                         std::string* contents, std::string* problem) {
  auto fail = [&](const std::string& what) {
    *problem = fmt::format("{}: {}", path, what);
    return false;
  };
  // O_NONBLOCK: opening a FIFO without a writer would otherwise wait for one. The type is taken
  // from the opened descriptor, so the file checked is the file read.
  Fd f{::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC)};
  if (f.fd < 0) return fail(fmt::format("cannot open {}: {}", kind, std::strerror(errno)));
  struct stat st;
  if (::fstat(f.fd, &st) != 0)
    return fail(fmt::format("cannot read {}: {}", kind, std::strerror(errno)));
  if (!S_ISREG(st.st_mode))
    return fail(fmt::format("{} is {}, not a regular file", kind, file_type_name(st.st_mode)));
  if (static_cast<uint64_t>(st.st_size) > max_bytes)
    return fail(fmt::format("{} is {} bytes, more than the limit of {} bytes", kind, st.st_size,
                            max_bytes));
  contents->clear();
  contents->reserve(static_cast<size_t>(st.st_size));
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(f.fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      return fail(fmt::format("error reading {}: {}", kind, std::strerror(errno)));
    }
    if (n == 0) break;
    if (static_cast<uint64_t>(n) > max_bytes - contents->size())
      return fail(fmt::format("{} holds more than the limit of {} bytes", kind, max_bytes));
    contents->append(buf, static_cast<size_t>(n));
  }
  return true;
}

}  // namespace npusim
