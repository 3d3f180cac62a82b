// Runs work in a forked child process and returns what it produced. SystemC elaborates one chip
// per process, so tests that compare two chip configs or two simulation modes run each in its
// own child. The child's exception, if any, fails the test with its message; so does a child
// that does not exit normally. Catch2 test helper (REQUIRE).
#pragma once

#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <exception>
#include <functional>
#include <string>

namespace npusim::test {

inline std::string run_in_child(const std::function<std::string()>& work) {
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    close(fds[0]);
    std::string text;
    try {
      text = "K" + work();  // 'K': the work's result follows; 'E': an exception's message
    } catch (const std::exception& e) {
      text = std::string("E") + e.what();
    }
    size_t done = 0;
    while (done < text.size()) {
      const ssize_t w = write(fds[1], text.data() + done, text.size() - done);
      if (w <= 0) break;
      done += static_cast<size_t>(w);
    }
    close(fds[1]);
    _exit(0);
  }
  close(fds[1]);
  std::string text;
  char buf[65536];
  for (;;) {
    const ssize_t n = read(fds[0], buf, sizeof buf);
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  REQUIRE(!text.empty());
  INFO("child: " << text.substr(1, 2000));
  REQUIRE(text[0] == 'K');
  return text.substr(1);
}

}  // namespace npusim::test
