`timescale 1ns/1ps
// $finish in the same time step as a change of q (it reacts to that change, before the toggle monitors'
// processes have woken up for it): the change must still count, as it does in a VCD.
module tb;
  reg clk = 0, rst_n = 0, load = 0, en = 0, up = 1;
  reg [3:0] d = 4'd0;
  wire [3:0] q;
  wire wrap;
  always @(q) if (q == 4'd2) $finish;
  counter #(.W(4)) uut (.clk(clk), .rst_n(rst_n), .load(load), .en(en), .up(up), .d(d), .q(q), .wrap(wrap));
  always #5 clk = ~clk;
  initial begin
    #12 rst_n = 1;
    @(negedge clk) en = 1;
  end
endmodule
