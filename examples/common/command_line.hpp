#pragma once
// The examples' command lines, read by Boost.Program_options: each example
// answers --help with what it does and its options, and a mistake (an
// unknown option, a missing or malformed value) is a message naming it and
// exit status 2, never a run with a silently ignored argument.
#include <boost/program_options.hpp>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>

namespace example {

namespace po = boost::program_options;

// The program's name as its user typed it, for messages.
inline std::string program_name(char** argv) { return std::filesystem::path(argv[0]).filename().string(); }

// Exits 2 after printing `why` and where to look.
[[noreturn]] inline void bad_command_line(const std::string& program, const std::string& why) {
  std::cerr << program << ": " << why << "\n(" << program << " --help lists the options)\n";
  std::exit(2);
}

// argv read against `options` (and --help); `positional` names the options
// that arguments without a name fill, in order.
inline po::variables_map command_line(int argc, char** argv, const std::string& about, po::options_description options,
                                      const po::positional_options_description& positional = {}) {
  options.add_options()("help,h", "print this help and exit");
  po::variables_map given;
  try {
    po::store(po::command_line_parser(argc, argv).options(options).positional(positional).run(), given);
    if (given.count("help")) {
      std::cout << about << "\n\n" << options;
      std::exit(0);
    }
    po::notify(given);
  } catch (const po::error& e) {
    bad_command_line(program_name(argv), e.what());
  }
  return given;
}

// The command line of an example whose one option is --smoke (the short run
// the test suite makes, as `smoke` describes it): whether it was given.
inline bool smoke_run(int argc, char** argv, const std::string& about, const std::string& smoke) {
  po::options_description options("options");
  options.add_options()("smoke", smoke.c_str());
  return command_line(argc, argv, about, options).count("smoke") > 0;
}

}  // namespace example
