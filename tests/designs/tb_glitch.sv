`timescale 1ns/1ps
module tb;
  reg clk = 0, a = 1, b = 0;
  wire y, w, p;
  glitch uut (.clk(clk), .a(a), .b(b), .y(y), .w(w), .p(p));
  always #5 clk = ~clk;
  initial begin
    repeat (3) begin #7 b = ~b; end
    #3 b = ~b;
    #10 a = 0;
    #10 $finish;
  end
endmodule
