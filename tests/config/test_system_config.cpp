// System descriptions (configs/systems/): presets, extends, overrides of system and chip keys,
// the resolved dump, and errors that name the file and key.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>

#include "common/error.h"
#include "sim/config/system_config.h"

using namespace npusim;

TEST_CASE("system presets load, with overrides and clear errors", "[system]") {
  const SystemConfig x16 = load_system_config("910b-x16");
  CHECK(x16.chips() == 16);
  CHECK(x16.servers == 2);
  CHECK(x16.chip.name == "910b");
  CHECK(x16.link.gbps == 56);
  const SystemConfig o =
      load_system_config("910b-x8", {"server.link.gbps=100", "chip.memory.hbm.gbps=900"});
  CHECK(o.link.gbps == 100);
  CHECK(o.chip.hbm_gbps == 900);
  CHECK_THROWS_WITH(load_system_config("910b-x8", {"server.topology=torus"}),
                    Catch::Contains("server.topology") && Catch::Contains("torus"));
  CHECK_THROWS_WITH(load_system_config("910b-x8", {"server.link.gbs=1"}),
                    Catch::Contains("server.link.gbs") && Catch::Contains("does not exist"));
  CHECK_THROWS_WITH(load_system_config("910b-x8", {"chip=nochip"}),
                    Catch::Contains("'chip'") && Catch::Contains("unknown chip 'nochip'"));
  CHECK_THROWS_WITH(load_system_config("910b-x9"), Catch::Contains("unknown system '910b-x9'"));
}

// A resolved YAML dump without its first line (which names the file it came from).
std::string body(const std::string& yaml) { return yaml.substr(yaml.find('\n')); }

TEST_CASE("the resolved system loads back as the same system", "[system]") {
  const SystemConfig a = load_system_config("910b-x16", {"scale_out.nic.gbps=50"});
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / "npusim_test_system_dump";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "chip.yaml") << dump_chip_config_yaml(a.chip);
  std::ofstream(dir / "system.yaml") << dump_system_config_yaml(a, "chip.yaml");
  const SystemConfig b = load_system_config((dir / "system.yaml").string());
  CHECK(b.nic.gbps == 50);
  CHECK(b.chips() == 16);
  CHECK(body(dump_system_config_yaml(b, "chip.yaml")) ==
        body(dump_system_config_yaml(a, "chip.yaml")));
  CHECK(body(dump_chip_config_yaml(b.chip)) == body(dump_chip_config_yaml(a.chip)));
  std::filesystem::remove_all(dir);
}

TEST_CASE("system errors name the file and key", "[system]") {
  CHECK_THROWS_WITH(load_system_config("910b-x8", {"servers=65"}),
                    Catch::Contains("key 'servers'") && Catch::Contains("[1, 64]"));
  CHECK_THROWS_WITH(load_system_config("910b-x8", {"servers=16"}),
                    Catch::Contains("16 servers x 8 chips = 128 chips"));
  CHECK_THROWS_WITH(load_system_config("910b-x8", {"server.link.latency_us=-1"}),
                    Catch::Contains("910b-x8.yaml: override 'server.link.latency_us=-1'") &&
                        Catch::Contains("server.link.latency_us"));
  CHECK_THROWS_WITH(load_system_config("910b-x8", {"chip.memory.hbm.gbs=1"}),
                    Catch::Contains("key 'chip'") && Catch::Contains("memory.hbm.gbs"));
  // 0.1 GB/s at 1850 MHz is 0.054 bytes per cycle: the device memory would not cross it
  // within the simulated clock's range.
  CHECK_THROWS_WITH(load_system_config("910b-x8", {"server.link.gbps=0.1"}),
                    Catch::Contains("server.link.gbps") && Catch::Contains("bytes per cycle"));
  CHECK_THROWS_WITH(load_system_config("910b-x8", {"scale_out.switch.latency_us=1e6"}),
                    Catch::Contains("scale_out.switch.latency_us"));
  CHECK(list_system_presets().size() >= 3);
}
