# CMake generated Testfile for 
# Source directory: /work/main
# Build directory: /work/main/build-isa
# 
# This file includes the relevant testing commands required for 
# testing this directory and lists subdirectories to be tested as well.
add_test("isa" "/work/main/build-isa/test_isa")
set_tests_properties("isa" PROPERTIES  ENVIRONMENT "NPUSIM_CONFIG_DIR=/work/main/configs/chips;NPUSIM_SOURCE_DIR=/work/main" _BACKTRACE_TRIPLES "/work/main/CMakeLists.txt;83;add_test;/work/main/CMakeLists.txt;0;")
