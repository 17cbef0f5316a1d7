`timescale 1ns/1ps
module tb;
  reg clk = 0; reg [2:0] en = 3'b000; reg [1:0] d = 2'b00;
  wire [5:0] q;
  gen_top uut (.clk(clk), .en(en), .d(d), .q(q));
  always #5 clk = ~clk;
  initial begin
    @(negedge clk) en = 3'b001; d = 2'b01;   // lane 0 loads 01
    @(negedge clk) d = 2'b10;                // lane 0 loads 10
    @(negedge clk) d = 2'b01;                // lane 0 loads 01
    @(negedge clk) en = 3'b000;
    @(negedge clk) $finish;
  end
endmodule
